"""A mutation corpus of DataGenRun manifests: the examples, each broken (or bent) one way, and the
field that must be named when it is refused. `datagen validate` and the API server must agree on all.

Used by tests/unit/api/test_api.py (validate alone, no server) and tests/operator/test_schema_corpus.py
(validate against the real API server).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datagen_operator.api import SpecError, parse_run
from datagen_operator.api.names import max_run_name_length
from tests.manifests import DELETE, EXAMPLES, Rename, changed, example_run

BASE_FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted((EXAMPLES / "presets").glob("*.yaml"))


@dataclass(frozen=True)
class Mutation:
    id: str
    base: str
    """An example, relative to examples/."""
    changes: tuple[tuple[str, Any], ...]
    """(dotted path, value | DELETE | Rename) applied in order."""
    refused_at: str | None
    """The field both must name; None: both must accept."""

    def manifest(self) -> dict[str, Any]:
        document = example_run(self.base.removesuffix(".yaml"))
        for path, value in self.changes:  # one at a time: a path may come back (a key moved to the end)
            document = changed(document, {path: value})
        return document


def mutate(id_: str, base: str, refused_at: str | None, *changes: tuple[str, Any]) -> Mutation:
    return Mutation(id_, base, changes, refused_at)


KIMI, QUICK, MISCONFIGURED = "kimi-k2.5.yaml", "quickstart.yaml", "misconfigured.yaml"
QWEN3, GPT_OSS, R1 = "presets/qwen3.yaml", "presets/gpt-oss.yaml", "presets/deepseek-r1.yaml"
K2_INSTRUCT, K2_THINKING, GLM = "presets/kimi-k2-instruct.yaml", "presets/kimi-k2-thinking.yaml", "presets/glm-4.5.yaml"
EXTERNAL = "external-server.yaml"
LONGEST_NAME = "r" * max_run_name_length()

MUTATIONS: list[Mutation] = [
    # the examples as they are
    *(Mutation(f"example {p.relative_to(EXAMPLES)}", str(p.relative_to(EXAMPLES)), (), None) for p in BASE_FILES),
    # wrong types (a YAML string or number where the schema says otherwise)
    mutate("gpus as a string", KIMI, "spec.server.gpus", ("spec.server.gpus", "8")),
    mutate("thinking as yes", QWEN3, "spec.generation.thinking", ("spec.generation.thinking", "yes")),
    mutate(
        "historyReasoning strip",
        "regenerate.yaml",
        "spec.generation.historyReasoning",
        ("spec.generation.historyReasoning", "strip"),
    ),
    mutate("historyReasoning drop", "regenerate.yaml", None, ("spec.generation.historyReasoning", "drop")),
    mutate("suspend as a string", QUICK, "spec.suspend", ("spec.suspend", "false")),
    mutate("requestTimeout as seconds", KIMI, "spec.clients.requestTimeout", ("spec.clients.requestTimeout", 3600)),
    mutate("startupTimeout as seconds", QUICK, "spec.server.startupTimeout", ("spec.server.startupTimeout", 2700)),
    mutate("shards fractional", KIMI, "spec.clients.shards", ("spec.clients.shards", 2.5)),
    mutate("rate as a string", KIMI, "spec.checks.minReasoningRate", ("spec.checks.minReasoningRate", "0.9")),
    mutate(
        "temperature as bool",
        R1,
        "spec.generation.sampling.temperature",
        ("spec.generation.sampling.temperature", True),
    ),
    mutate("extraArgs as a string", QUICK, "spec.server.extraArgs", ("spec.server.extraArgs", "--foo")),
    mutate(
        "nodeSelector value a number", KIMI, "spec.server.nodeSelector.pool", ("spec.server.nodeSelector", {"pool": 1})
    ),
    mutate(
        "stop_token_ids of strings",
        QWEN3,
        "spec.generation.sampling.stop_token_ids[0]",
        ("spec.generation.sampling.stop_token_ids", ["1"]),
    ),
    mutate("model as a string", QUICK, "spec.model", ("spec.model", "kimi")),
    # unknown keys, snake_case spellings of camelCase keys
    mutate("unknown server key", KIMI, "spec.server.gpuCount", ("spec.server.gpuCount", 8)),
    mutate("unknown spec section", QUICK, "spec.scheduling", ("spec.scheduling", {"queue": "a"})),
    mutate("max_attempts snake_case", KIMI, "spec.clients.max_attempts", ("spec.clients.max_attempts", 3)),
    mutate(
        "tensor_parallel snake_case",
        KIMI,
        "spec.server.tensor_parallel",
        ("spec.server.tensorParallel", Rename("tensor_parallel")),
    ),
    mutate(
        "canary_prompts snake_case",
        GLM,
        "spec.checks.canary_prompts",
        ("spec.checks.canaryPrompts", Rename("canary_prompts")),
    ),
    mutate(
        "claim_name snake_case",
        KIMI,
        "spec.model.volume.persistentVolumeClaim.claim_name",
        ("spec.model.volume.persistentVolumeClaim.readOnly", DELETE),
        ("spec.model.volume.persistentVolumeClaim.claimName", Rename("claim_name")),
        ("spec.model.volume.persistentVolumeClaim.readOnly", True),
    ),
    mutate(
        "max_tokens (OpenAI's name)",
        QWEN3,
        "spec.generation.sampling.max_tokens",
        ("spec.generation.sampling.max_tokens", 100),
    ),
    # numbers out of range
    mutate("gpus 0", KIMI, "spec.server.gpus", ("spec.server.gpus", 0)),
    mutate("gpus 65", GPT_OSS, "spec.server.gpus", ("spec.server.gpus", 65)),
    mutate("replicas 0", KIMI, "spec.server.replicas", ("spec.server.replicas", 0)),
    mutate("port 80", QUICK, "spec.server.port", ("spec.server.port", 80)),
    mutate("memFractionStatic 0", KIMI, "spec.server.memFractionStatic", ("spec.server.memFractionStatic", 0)),
    mutate("memFractionStatic 1.5", KIMI, "spec.server.memFractionStatic", ("spec.server.memFractionStatic", 1.5)),
    mutate("minReasoningRate 1.5", KIMI, "spec.checks.minReasoningRate", ("spec.checks.minReasoningRate", 1.5)),
    mutate("samplesPerPrompt 0", QWEN3, "spec.generation.samplesPerPrompt", ("spec.generation.samplesPerPrompt", 0)),
    mutate(
        "samplesPerPrompt 2, temperature 0 (greedy: identical samples)",
        QWEN3,
        "spec.generation.samplesPerPrompt",
        ("spec.generation.samplesPerPrompt", 2),
        ("spec.generation.sampling.temperature", 0),
    ),
    mutate(
        "samplesPerPrompt 2, top_k 1 (greedy: identical samples)",
        R1,
        "spec.generation.samplesPerPrompt",
        ("spec.generation.samplesPerPrompt", 2),
        ("spec.generation.sampling.top_k", 1),
    ),
    mutate(
        "samplesPerPrompt 2, temperature 0.6",
        QWEN3,
        None,
        ("spec.generation.samplesPerPrompt", 2),
        ("spec.generation.sampling.temperature", 0.6),
    ),
    mutate("concurrency 5000", QUICK, "spec.clients.concurrency", ("spec.clients.concurrency", 5000)),
    mutate("concurrency 0", QUICK, "spec.clients.concurrency", ("spec.clients.concurrency", 0)),
    mutate("concurrency auto2", QUICK, "spec.clients.concurrency", ("spec.clients.concurrency", "auto2")),
    mutate("concurrency '64' (a string)", QUICK, "spec.clients.concurrency", ("spec.clients.concurrency", "64")),
    mutate("concurrency auto", QUICK, None, ("spec.clients.concurrency", "auto")),
    mutate("shards 10001", KIMI, "spec.clients.shards", ("spec.clients.shards", 10001)),
    mutate("top_p 0", R1, "spec.generation.sampling.top_p", ("spec.generation.sampling.top_p", 0)),
    mutate(
        "max_new_tokens 0",
        QUICK,
        "spec.generation.sampling.max_new_tokens",
        ("spec.generation.sampling.max_new_tokens", 0),
    ),
    mutate("canaryMaxNewTokens 8", QUICK, "spec.checks.canaryMaxNewTokens", ("spec.checks.canaryMaxNewTokens", 8)),
    mutate("memFractionStatic 1 (an integer number)", KIMI, None, ("spec.server.memFractionStatic", 1)),
    # patterns and enums
    mutate("shmSize lots", KIMI, "spec.server.shmSize", ("spec.server.shmSize", "lots")),
    mutate("clients.cpu lots", KIMI, "spec.clients.cpu", ("spec.clients.cpu", "lots")),
    mutate("clients.memory 1 GB", KIMI, "spec.clients.memory", ("spec.clients.memory", "1 GB")),
    mutate("clients.cpu 500m", KIMI, None, ("spec.clients.cpu", "500m"), ("spec.clients.memory", "2Gi")),
    mutate("onFailure Ignore", KIMI, "spec.checks.onFailure", ("spec.checks.onFailure", "Ignore")),
    mutate("logLevel trace", QUICK, "spec.server.logLevel", ("spec.server.logLevel", "trace")),
    mutate("unknown preset", QUICK, "spec.model.preset", ("spec.model.preset", "llama-5")),
    mutate(
        "unknown reasoning parser",
        MISCONFIGURED,
        "spec.server.reasoningParser",
        ("spec.server.reasoningParser", "kimi-k2"),
    ),
    mutate(
        "servedModelName with a space", KIMI, "spec.model.servedModelName", ("spec.model.servedModelName", "my model")
    ),
    mutate(
        "env name starting with a digit",
        KIMI,
        "spec.server.env[0].name",
        ("spec.server.env", [{"name": "1BAD", "value": "x"}]),
    ),
    # durations
    mutate("startupTimeout 45 (no unit)", KIMI, "spec.server.startupTimeout", ("spec.server.startupTimeout", "45")),
    mutate("requestTimeout 1d", KIMI, "spec.clients.requestTimeout", ("spec.clients.requestTimeout", "1d")),
    mutate("startupTimeout empty", QUICK, "spec.server.startupTimeout", ("spec.server.startupTimeout", "")),
    mutate("startupTimeout 1h30m", QUICK, None, ("spec.server.startupTimeout", "1h30m")),
    # names: what every child object (pods, Services, Jobs, labels) can carry
    mutate("name with a dot", QUICK, "metadata.name", ("metadata.name", "quick.start")),
    mutate("name uppercase", QUICK, "metadata.name", ("metadata.name", "QuickStart")),
    mutate("name starting with a digit", QUICK, "metadata.name", ("metadata.name", "1quickstart")),
    mutate("name one too long", QUICK, "metadata.name", ("metadata.name", LONGEST_NAME + "r")),
    mutate("name 52 characters", QUICK, "metadata.name", ("metadata.name", "r" * 52)),
    mutate("name at the limit", KIMI, None, ("metadata.name", LONGEST_NAME)),
    # cross-field rules (CEL in the CRD)
    mutate("tensorParallel 3 of 8 gpus", KIMI, "spec.server.tensorParallel", ("spec.server.tensorParallel", 3)),
    mutate("tensorParallel 4 of 8 gpus", KIMI, None, ("spec.server.tensorParallel", 4)),
    mutate("2 nodes, tensorParallel 16", KIMI, None, ("spec.server.nodes", 2), ("spec.server.tensorParallel", 16)),
    mutate(
        "2 nodes, tensorParallel unset", KIMI, None, ("spec.server.nodes", 2), ("spec.server.tensorParallel", DELETE)
    ),
    mutate("2 nodes, tensorParallel 8", KIMI, "spec.server.tensorParallel", ("spec.server.nodes", 2)),
    mutate(
        "2 nodes, tensorParallel 32",
        KIMI,
        "spec.server.tensorParallel",
        ("spec.server.nodes", 2),
        ("spec.server.tensorParallel", 32),
    ),
    mutate("nodes 0", KIMI, "spec.server.nodes", ("spec.server.nodes", 0)),
    mutate(
        "attentionDataParallel 8 of tp 8", R1, None, ("spec.server.gpus", 8), ("spec.server.attentionDataParallel", 8)
    ),
    mutate(
        "attentionDataParallel 16 over 2 nodes",
        R1,
        None,
        ("spec.server.gpus", 8),
        ("spec.server.nodes", 2),
        ("spec.server.attentionDataParallel", 16),
    ),
    mutate(
        "attentionDataParallel 3 of tp 8",
        KIMI,
        "spec.server.attentionDataParallel",
        ("spec.server.attentionDataParallel", 3),
    ),
    mutate(
        "attentionDataParallel 3 of tp 16 unset over 2 nodes",
        KIMI,
        "spec.server.attentionDataParallel",
        ("spec.server.nodes", 2),
        ("spec.server.tensorParallel", DELETE),
        ("spec.server.attentionDataParallel", 3),
    ),
    mutate(
        "attentionDataParallel with dp replicas",
        KIMI,
        "spec.server.attentionDataParallel",
        ("spec.server.tensorParallel", 4),
        ("spec.server.attentionDataParallel", 2),
    ),
    mutate(
        "attentionDataParallel 0", KIMI, "spec.server.attentionDataParallel", ("spec.server.attentionDataParallel", 0)
    ),
    mutate("image :latest", KIMI, "spec.server.image", ("spec.server.image", "lmsysorg/sglang:latest")),
    mutate("image without a tag", QUICK, "spec.server.image", ("spec.server.image", "registry:5000/sglang")),
    mutate("image by digest", QUICK, None, ("spec.server.image", "lmsysorg/sglang@sha256:" + "0" * 64)),
    mutate("no preset, no parsers", QUICK, "spec.model.preset", ("spec.model.preset", DELETE)),
    mutate(
        "reasoningParser contradicts preset",
        KIMI,
        "spec.server.reasoningParser",
        ("spec.server.reasoningParser", "kimi"),
    ),
    mutate(
        "toolCallParser contradicts preset",
        KIMI,
        "spec.server.toolCallParser",
        ("spec.server.toolCallParser", "qwen25"),
    ),
    mutate("toolCallParser qwen for qwen25 (same parser)", QWEN3, None, ("spec.server.toolCallParser", "qwen")),
    mutate(
        "thinking on a non-thinking preset", K2_INSTRUCT, "spec.generation.thinking", ("spec.generation.thinking", True)
    ),
    mutate(
        "thinking off on an always-thinking preset",
        K2_THINKING,
        "spec.generation.thinking",
        ("spec.generation.thinking", False),
    ),
    mutate(
        "thinking without a reasoning parser",
        MISCONFIGURED,
        "spec.server.reasoningParser",
        ("spec.server.reasoningParser", "none"),
    ),
    mutate(
        "templateVariables of the run",
        GPT_OSS,
        None,
        ("spec.generation.templateVariables", {"reasoning_effort": "low"}),
    ),
    mutate(
        "conversation rows of one answer a line",
        KIMI,
        "spec.export",
        ("spec.export", {"formats": ["speculators"], "rows": "conversations"}),
    ),
    mutate(
        "conversation rows of whole conversations",
        "regenerate.yaml",
        None,
        ("spec.export", {"formats": ["speculators", "conversations"], "rows": "conversations"}),
    ),
    mutate("volume without a source", KIMI, "spec.dataset.volume", ("spec.dataset.volume", {})),
    mutate(
        "volume with two sources",
        KIMI,
        "spec.model.volume",
        ("spec.model.volume.hostPath", {"path": "/models"}),
    ),
    mutate(
        "env with value and valueFrom",
        KIMI,
        "spec.server.env[0]",
        ("spec.server.env", [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
    ),
    mutate("top_k 0 without greedy", R1, "spec.generation.sampling.top_k", ("spec.generation.sampling.top_k", 0)),
    mutate(
        "top_k 0 with temperature 0 (greedy)",
        R1,
        None,
        ("spec.generation.sampling.top_k", 0),
        ("spec.generation.sampling.temperature", 0),
    ),
    mutate(
        "min_new_tokens above max_new_tokens",
        QUICK,
        "spec.generation.sampling.min_new_tokens",
        ("spec.generation.sampling.min_new_tokens", 9000),
    ),
    # extraArgs naming a flag the operator manages or refuses: CEL on each item, as validate does.
    mutate(
        "extraArgs with a managed flag", KIMI, "spec.server.extraArgs[0]", ("spec.server.extraArgs", ["--tp-size=4"])
    ),
    mutate(
        "extraArgs with a managed alias, value apart",
        KIMI,
        "spec.server.extraArgs[1]",
        ("spec.server.extraArgs", ["--watchdog-timeout=600", "--model", "/x"]),
    ),
    mutate(
        "extraArgs with a server-side chat template",
        KIMI,
        "spec.server.extraArgs[0]",
        ("spec.server.extraArgs", ["--chat-template", "/t.jinja"]),
    ),
    mutate("extraArgs with a flag SGLang takes", KIMI, None, ("spec.server.extraArgs", ["--watchdog-timeout", "600"])),
    # Data-changing flags (api/extra_args.py), also as SGLang reads an abbreviation.
    mutate(
        "extraArgs with server-side sampling params",
        KIMI,
        "spec.server.extraArgs[0]",
        ("spec.server.extraArgs", ["--preferred-sampling-params", '{"temperature": 1.5}']),
    ),
    mutate(
        "extraArgs with an abbreviated refused flag",
        KIMI,
        "spec.server.extraArgs[1]",
        ("spec.server.extraArgs", ["--watchdog-timeout=600", "--preferred-sampling={}"]),
    ),
    mutate(
        "extraArgs with an abbreviated managed flag",
        KIMI,
        "spec.server.extraArgs[0]",
        ("spec.server.extraArgs", ["--mem-fraction", "0.5"]),
    ),
    mutate(
        "speculative decoding with min_p",
        KIMI,
        "spec.generation.sampling.min_p",
        ("spec.server.extraArgs", ["--speculative-algorithm", "EAGLE"]),
        ("spec.generation.sampling.min_p", 0.05),
    ),
    mutate(
        "speculative decoding with temperature and top_p",
        KIMI,
        None,
        ("spec.server.extraArgs", ["--speculative-algorithm", "EAGLE"]),
    ),
    mutate("export two formats", KIMI, None, ("spec.export", {"formats": ["speculators", "trl"], "maxLength": 8192})),
    mutate(
        "export path leaving the output",
        KIMI,
        "spec.export.path",
        ("spec.export", {"formats": ["trl"], "path": "../x"}),
    ),
    mutate(
        "export flags known",
        KIMI,
        None,
        ("spec.export", {"formats": ["trl"], "excludeFlags": ["truncated", "truncated_by_memory", "aborted"]}),
    ),
    mutate(
        "export flag misspelled",
        KIMI,
        "spec.export.excludeFlags[1]",
        ("spec.export", {"formats": ["trl"], "excludeFlags": ["truncated", "truncted"]}),
    ),
    # Kueue: a LocalQueue and a WorkloadPriorityClass, names that fit in a label value (docs/kueue.md)
    mutate(
        "queue with a priority",
        KIMI,
        None,
        ("spec.queue", {"name": "team-a.gpus", "workloadPriorityClassName": "batch-low"}),
    ),
    mutate("queue without a name", KIMI, "spec.queue.name", ("spec.queue", {"workloadPriorityClassName": "low"})),
    mutate("queue name uppercase", QUICK, "spec.queue.name", ("spec.queue", {"name": "TeamA"})),
    mutate("queue name over 63", QUICK, "spec.queue.name", ("spec.queue", {"name": "q" * 64})),
    mutate(
        "workload priority class with a slash",
        KIMI,
        "spec.queue.workloadPriorityClassName",
        ("spec.queue", {"name": "gpus", "workloadPriorityClassName": "kueue/low"}),
    ),
    # dataset.sample: a count or a fraction, seeded (prompts/draws.py)
    mutate("sample a count", QUICK, None, ("spec.dataset.sample", {"count": 100, "seed": 7})),
    mutate("sample a fraction", QUICK, None, ("spec.dataset.sample", {"fraction": 1})),
    mutate(
        "sample a count and a fraction",
        QUICK,
        "spec.dataset.sample",
        ("spec.dataset.sample", {"count": 5, "fraction": 0.5}),
    ),
    mutate("sample only a seed", QUICK, "spec.dataset.sample", ("spec.dataset.sample", {"seed": 3})),
    mutate("sample a fraction of 0", QUICK, "spec.dataset.sample.fraction", ("spec.dataset.sample", {"fraction": 0})),
    mutate(
        "sample a fraction over 1", QUICK, "spec.dataset.sample.fraction", ("spec.dataset.sample", {"fraction": 1.5})
    ),
    mutate("sample a count of 0", QUICK, "spec.dataset.sample.count", ("spec.dataset.sample", {"count": 0})),
    mutate(
        "sample a negative seed", QUICK, "spec.dataset.sample.seed", ("spec.dataset.sample", {"count": 5, "seed": -1})
    ),
    # generation.templateVariableMix: weighted choices per variable (gpt-oss's effort mix)
    mutate(
        "an effort mix",
        GPT_OSS,
        None,
        (
            "spec.generation.templateVariableMix",
            {
                "seed": 1,
                "variables": {
                    "reasoning_effort": [
                        {"value": "low", "weight": 4},
                        {"value": "medium", "weight": 4},
                        {"value": "high", "weight": 2},
                    ]
                },
            },
        ),
    ),
    mutate(
        "a mix without variables",
        GPT_OSS,
        "spec.generation.templateVariableMix.variables",
        ("spec.generation.templateVariableMix", {"variables": {}}),
    ),
    mutate(
        "a mix variable without choices",
        GPT_OSS,
        "spec.generation.templateVariableMix.variables.reasoning_effort",
        ("spec.generation.templateVariableMix", {"variables": {"reasoning_effort": []}}),
    ),
    mutate(
        "a mix choice of weight 0",
        GPT_OSS,
        "spec.generation.templateVariableMix.variables.reasoning_effort[0].weight",
        ("spec.generation.templateVariableMix", {"variables": {"reasoning_effort": [{"value": "low", "weight": 0}]}}),
    ),
    mutate(
        "a mix choice without a value",
        GPT_OSS,
        "spec.generation.templateVariableMix.variables.reasoning_effort[0].value",
        ("spec.generation.templateVariableMix", {"variables": {"reasoning_effort": [{"weight": 1}]}}),
    ),
    # server.external (an SGLang the run does not own): one of urls or service; an owned server's fields refused
    *(
        mutate(f"external with {field}", EXTERNAL, f"spec.server.{field}", (f"spec.server.{field}", value))
        for field, value in (
            ("gpus", 2),
            ("image", "lmsysorg/sglang:v0.5.22"),
            ("replicas", 2),
            ("extraArgs", ["--watchdog-timeout", "600"]),
            ("tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists"}]),
            ("memFractionStatic", 0.8),
            ("logLevel", "debug"),
        )
    ),
    mutate("external with gpus at its default", EXTERNAL, None, ("spec.server.gpus", 8)),
    mutate("external with parsers and a startup timeout", EXTERNAL, None, ("spec.server.startupTimeout", "5m")),
    mutate(
        "external urls",
        EXTERNAL,
        None,
        ("spec.server.external", {"urls": ["http://sglang-a.ml.svc:30000", "https://sglang-b.example.com/v0"]}),
    ),
    mutate(
        "external urls and service",
        EXTERNAL,
        "spec.server.external.urls",
        ("spec.server.external.urls", ["http://10.0.0.7:30000"]),
    ),
    mutate("external with neither", EXTERNAL, "spec.server.external.urls", ("spec.server.external", {})),
    mutate(
        "external url with credentials",
        EXTERNAL,
        "spec.server.external.urls[0]",
        ("spec.server.external", {"urls": ["http://user:secret@sglang:30000"]}),
    ),
    mutate(
        "external url repeated",
        EXTERNAL,
        "spec.server.external.urls",
        ("spec.server.external", {"urls": ["http://sglang:30000", "http://sglang:30000"]}),
    ),
    mutate("external urls empty", EXTERNAL, "spec.server.external.urls", ("spec.server.external", {"urls": []})),
    mutate(
        "external service port 0",
        EXTERNAL,
        "spec.server.external.service.port",
        ("spec.server.external.service.port", 0),
    ),
    mutate(
        "external service name uppercase",
        EXTERNAL,
        "spec.server.external.service.name",
        ("spec.server.external.service.name", "SGLang"),
    ),
]


def validate_verdict(manifest: dict[str, Any]) -> set[str]:
    """The fields `datagen validate` names (empty: accepted)."""
    try:
        parse_run(manifest)
    except SpecError as error:
        return {e.field for e in error.errors}
    return set()
