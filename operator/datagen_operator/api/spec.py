"""The DataGenRun spec: what a user writes. The CRD schema is generated from these models."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from datagen_operator.api.duration import Duration
from datagen_operator.api.errors import cross_field_error
from datagen_operator.api.flags import ALL_FLAGS, unknown_flags_problem
from datagen_operator.api.names import MAX_SERVER_REPLICAS, MAX_SHARDS, run_name_problem
from datagen_operator.presets.sglang_names import (
    DEFAULT_SGLANG_IMAGE,
    REASONING_PARSER_NAMES,
    TOOL_CALL_PARSER_NAMES,
)

ApiGroupVersion = Literal["datagen.dev/v1alpha1"]
"""The one spelling of the API version: a manifest's apiVersion must be it (DataGenRun), the rest derive from it."""
API_GROUP_VERSION: str = get_args(ApiGroupVersion)[0]
API_GROUP, API_VERSION = API_GROUP_VERSION.split("/")
KIND = "DataGenRun"
PLURAL = "datagenruns"

NO_PARSER = "none"
"""Explicitly no parser (a model without reasoning or tool calls); distinct from 'unset, use the preset'."""
AUTO_PARSER = "auto"
"""SGLang's own choice of a parser from the chat template at start-up: refused in a spec, which names its parser."""

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
CPU_PATTERN = QUANTITY_PATTERN + "|^[0-9]+m$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SUB_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
"""A relative folder path whose segments never start with a dot: no '..' escape (RE2 has no lookahead)."""


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
    )


# --- volumes, env, scheduling: small typed subsets of the Kubernetes core types --------------------


class PersistentVolumeClaimSource(SpecModel):
    claim_name: str = Field(min_length=1, description="Name of a PersistentVolumeClaim in the run's namespace.")
    read_only: bool = False


class HostPathSource(SpecModel):
    path: str = Field(min_length=1, description="Absolute path on the node.")


class NfsSource(SpecModel):
    server: str = Field(min_length=1)
    path: str = Field(min_length=1)
    read_only: bool = False


class VolumeSource(SpecModel):
    """Where a path lives in a cluster: exactly one source. Ignored by `datagen run` on one machine."""

    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    host_path: HostPathSource | None = None
    nfs: NfsSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> VolumeSource:
        count = sum(s is not None for s in (self.persistent_volume_claim, self.host_path, self.nfs))
        if count != 1:
            raise ValueError("set exactly one of persistentVolumeClaim, hostPath, nfs")
        return self


class SecretKeyRef(SpecModel):
    name: str = Field(min_length=1, description="Secret name (its value never appears in status or logs).")
    key: str = Field(min_length=1)


class EnvVarSource(SpecModel):
    secret_key_ref: SecretKeyRef


class EnvVar(SpecModel):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str | None = None
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value, valueFrom")
        return self


class Toleration(SpecModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


# --- the run -----------------------------------------------------------------------------------


class ThinkTokens(SpecModel):
    start: str = Field(min_length=1, description="Text of the think opener token, e.g. <think>.")
    end: str = Field(min_length=1, description="Text of the think closer token, e.g. </think>.")


class ModelSpec(SpecModel):
    preset: str | None = Field(
        default=None,
        description="Model family preset (parsers, think and stop tokens, template switch). "
        "`datagen presets` lists them. Without it, set server.reasoningParser and server.toolCallParser.",
    )
    path: str = Field(min_length=1, description="Model directory as the server sees it (inside the volume).")
    volume: VolumeSource | None = Field(default=None, description="Volume holding the model, mounted read-only.")
    tokenizer_path: str | None = Field(
        default=None,
        description="Tokenizer directory if not the model directory: the workers render prompts with it and the "
        "server loads it (--tokenizer-path), so it must be visible to both (e.g. inside the model volume).",
    )
    served_model_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._/-]+$")
    trust_remote_code: bool | None = Field(
        default=None, description="Load the model's own code (Kimi needs it). Default: from the preset."
    )
    think_tokens: ThinkTokens | None = Field(
        default=None, description="Think tags for a model without a preset; presets already know theirs."
    )
    sub_path: str | None = Field(
        default=None,
        pattern=SUB_PATH_PATTERN,
        description="Folder inside the model volume to mount at model.path (one shared volume, one folder per "
        "model). Relative; no '.' or '..' segments.",
    )

    @property
    def tokenizer_dir(self) -> str:
        """The tokenizer's directory: tokenizerPath, else the model directory (a rule, not a field: it is
        neither written nor in the CRD)."""
        return self.tokenizer_path or self.path

    @property
    def tokenizer_field(self) -> str:
        """The spec field `tokenizer_dir` comes from, as an error message names it."""
        return "spec.model.tokenizerPath" if self.tokenizer_path else "spec.model.path"


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
EXTERNAL_URL_PATTERN = r"^https?://[^\s/?#@]+(/[^\s?#@]*)?$"
"""A base URL without credentials, query or fragment (the URLs are shown in the run's status and logs)."""


class ExternalServiceRef(SpecModel):
    """A Kubernetes Service in front of an SGLang the run does not own (an OME InferenceService, a KServe
    LLMInferenceService, a Deployment of your own): the operator sends to http://NAME.NAMESPACE.svc:PORT."""

    name: str = Field(max_length=63, pattern=DNS_LABEL_PATTERN, description="The Service's name.")
    port: int = Field(ge=1, le=65535, description="The Service port that serves SGLang's HTTP API.")
    namespace: str | None = Field(
        default=None, max_length=63, pattern=DNS_LABEL_PATTERN, description="Its namespace; default: the run's."
    )


class ExternalServer(SpecModel):
    """An SGLang server the run does not own: it starts, scales and stops nothing, and holds it to the same
    checks as its own (preflight, parser check on /server_info, canary, rolling checks, verification)."""

    model_config = ConfigDict(
        json_schema_extra={  # the CRD's rules; _one_form checks the same for `datagen validate`
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.urls) != has(self.service)",
                    "message": "set exactly one of urls, service",
                    "fieldPath": ".urls",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.urls) || self.urls.all(u, self.urls.exists_one(v, v == u))",
                    "message": "each URL once: a repeated URL would take twice the requests",
                    "fieldPath": ".urls",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    urls: list[Annotated[str, StringConstraints(max_length=2048, pattern=EXTERNAL_URL_PATTERN)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SERVER_REPLICAS,
        description="Base URLs of SGLang servers (http://host:30000), each probed and checked; every shard's "
        "worker spreads its requests over the ones that answer. No credentials in them.",
    )
    service: ExternalServiceRef | None = Field(
        default=None, description="A Kubernetes Service (the operator only; `datagen run` needs urls)."
    )

    @model_validator(mode="after")
    def _one_form(self) -> ExternalServer:
        if (self.urls is None) == (self.service is None):
            raise cross_field_error("urls", "set exactly one of urls, service")
        if self.urls is not None and len(set(self.urls)) != len(self.urls):
            raise cross_field_error("urls", "each URL once: a repeated URL would take twice the requests")
        return self


OWNED_SERVER_FIELDS: tuple[str, ...] = (
    "image",
    "gpus",
    "nodes",
    "tensor_parallel",
    "attention_data_parallel",
    "replicas",
    "mem_fraction_static",
    "extra_args",
    "port",
    "shm_size",
    "cpu",
    "memory",
    "env",
    "node_selector",
    "tolerations",
    "affinity",
    "priority_class_name",
    "runtime_class_name",
    "log_level",
)
"""ServerSpec fields that configure a server the run starts: refused away from their defaults with
server.external (the parsers stay: they say what the external server must run; startupTimeout stays: how long
the run waits for it to answer)."""


def external_server_refusal(field_alias: str) -> str:
    """Why a field of an owned server is refused beside server.external: the one wording of both validators."""
    return (
        f"server.external is set: the run starts no server, so server.{field_alias} has nothing to configure; remove "
        "it (set it where the external server is deployed)"
    )


class ServerSpec(SpecModel):
    # The CRD's rules for this object, beside the validators that check the same for `datagen validate`.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.tensorParallel) || !has(self.gpus) || (has(self.nodes) && self.nodes > 1)"
                    " || self.gpus % self.tensorParallel == 0",
                    "message": "tensorParallel must divide gpus (SGLang needs tp-size x dp-size = GPUs)",
                    "fieldPath": ".tensorParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.tensorParallel) || !has(self.gpus) || !has(self.nodes) || self.nodes <= 1"
                    " || self.tensorParallel == self.gpus * self.nodes",
                    "message": "with nodes > 1, tensorParallel must be gpus x nodes (one SGLang server spans every "
                    "GPU of the group)",
                    "fieldPath": ".tensorParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.attentionDataParallel) || !has(self.gpus) || self.attentionDataParallel <= 1"
                    " || (!has(self.tensorParallel) ? self.gpus * (has(self.nodes) ? self.nodes : 1)"
                    " : self.tensorParallel) % self.attentionDataParallel == 0",
                    "message": "attentionDataParallel must divide tensorParallel (SGLang splits the tensor-parallel "
                    "group into attention data-parallel groups)",
                    "fieldPath": ".attentionDataParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.attentionDataParallel) || !has(self.gpus) || self.attentionDataParallel <= 1"
                    " || !has(self.tensorParallel) || self.tensorParallel == self.gpus * (has(self.nodes) ? self.nodes"
                    " : 1)",
                    "message": "attentionDataParallel needs tensorParallel = gpus x nodes: SGLang refuses "
                    "data-parallel replicas (--dp-size) together with --attn-dp-size",
                    "fieldPath": ".attentionDataParallel",
                    "reason": "FieldValueInvalid",
                },
                {
                    # has(): the API server also checks the rules against the `{}` default, before nested defaults
                    "rule": "!has(self.image) || (!self.image.endsWith(':latest') && (self.image.contains('@sha256:')"
                    " || self.image.split('/')[self.image.split('/').size() - 1].contains(':')))",
                    "message": "server.image must be pinned by tag or digest, never :latest",
                    "fieldPath": ".image",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    image: str = Field(
        default=DEFAULT_SGLANG_IMAGE,
        pattern=r"^\S+$",
        description="SGLang image, pinned by tag or digest (never :latest).",
    )
    gpus: int = Field(default=8, ge=1, le=64, description="GPUs per server pod (in limits).")
    nodes: int = Field(
        default=1,
        ge=1,
        le=32,
        description="Pods (nodes) per server. Above 1 the server is a LeaderWorkerSet group (LWS must be "
        "installed): one SGLang server over nodes x gpus GPUs, HTTP on the leader.",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="--tp-size; must divide gpus (with nodes > 1: must be gpus x nodes). Default: every GPU "
        "of the server.",
    )
    attention_data_parallel: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="--attn-dp-size: attention data-parallel groups inside the tensor-parallel group, each "
        "with its own KV cache (MLA models: Kimi, DeepSeek). Must divide tensorParallel.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_SERVER_REPLICAS,
        description="Data-parallel servers (pods, or groups with nodes > 1); workers spread over them.",
    )
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1, description="--mem-fraction-static.")
    reasoning_parser: str | None = Field(
        default=None, description="--reasoning-parser; default from the preset; `none` for no parser."
    )
    tool_call_parser: str | None = Field(
        default=None, description="--tool-call-parser; default from the preset; `none` for no parser."
    )
    # Bounded so the API server can price the CEL rules on each item (and validate refuses the same).
    extra_args: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="More sglang.launch_server flags; flags the operator manages are refused.",
    )
    startup_timeout: Duration = Field(
        default="45m",
        validate_default=True,
        description="How long model loading may take before the server counts as failed.",
    )
    port: int = Field(default=30000, ge=1024, le=65535)
    shm_size: str = Field(default="64Gi", pattern=QUANTITY_PATTERN, description="Memory-backed /dev/shm size.")
    cpu: str | None = Field(default=None, pattern=CPU_PATTERN)
    memory: str | None = Field(default=None, pattern=QUANTITY_PATTERN)
    env: list[EnvVar] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Kubernetes affinity for the server pods (nodeAffinity, podAntiAffinity, ...), passed through.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    priority_class_name: str | None = None
    runtime_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="RuntimeClass of the server pods (e.g. `nvidia` where the GPU runtime is not the default).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    external: ExternalServer | None = Field(
        default=None,
        description="Use an SGLang server the run does not own (urls, or a Kubernetes Service): no server is "
        "started, scaled or stopped; the fields that configure one are refused. reasoningParser and "
        "toolCallParser say what it must run (checked on its /server_info).",
    )

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, value: str) -> str:
        last = value.rsplit("/", 1)[-1]
        if "@sha256:" not in value and (":" not in last or last.endswith(":latest")):
            raise ValueError(f"{value!r} is not pinned; name a tag like {DEFAULT_SGLANG_IMAGE} or a digest")
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        return _known_parser(value, REASONING_PARSER_NAMES, "reasoning")

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, value: str | None) -> str | None:
        return _known_parser(value, TOOL_CALL_PARSER_NAMES, "tool-call")

    @model_validator(mode="after")
    def _external_owns_nothing(self) -> ServerSpec:
        # The same rules as crd.external_server_cel_rules, one per field, in OWNED_SERVER_FIELDS' order.
        if self.external is None:
            return self
        for name in OWNED_SERVER_FIELDS:
            field = type(self).model_fields[name]
            if getattr(self, name) != field.get_default(call_default_factory=True):
                raise cross_field_error(to_camel(name), external_server_refusal(to_camel(name)))
        return self

    @model_validator(mode="after")
    def _parallelism_fits_the_gpus(self) -> ServerSpec:
        # The same rules as the CEL ones above, in their order.
        if self.nodes == 1 and self.gpus % self.tp_size:
            raise cross_field_error(
                "tensorParallel",
                f"tensorParallel {self.tp_size} does not divide gpus {self.gpus}: SGLang needs "
                f"tp-size x dp-size = GPUs; set tensorParallel to a divisor of {self.gpus}",
            )
        if self.nodes > 1 and self.tp_size != self.server_gpus:
            raise cross_field_error(
                "tensorParallel",
                f"tensorParallel {self.tp_size} is not gpus x nodes = {self.gpus} x {self.nodes}: one SGLang "
                f"server spans every GPU of the group; set tensorParallel to {self.server_gpus} or leave it unset",
            )
        attention_dp = self.attn_dp_size
        if attention_dp > 1 and self.tp_size % attention_dp:
            raise cross_field_error(
                "attentionDataParallel",
                f"attentionDataParallel {attention_dp} does not divide tensorParallel {self.tp_size}: SGLang "
                "splits the tensor-parallel group into attention data-parallel groups",
            )
        if attention_dp > 1 and self.dp_size > 1:
            raise cross_field_error(
                "attentionDataParallel",
                f"attentionDataParallel {attention_dp} with tensorParallel {self.tp_size} below gpus x nodes "
                f"({self.server_gpus}): SGLang refuses data-parallel replicas (--dp-size {self.dp_size}) together "
                "with --attn-dp-size; set tensorParallel to gpus x nodes",
            )
        return self

    @property
    def server_gpus(self) -> int:
        """GPUs of one server: every pod of its group."""
        return self.gpus * self.nodes

    @property
    def tp_size(self) -> int:
        return self.tensor_parallel or self.server_gpus

    @property
    def dp_size(self) -> int:
        return self.server_gpus // self.tp_size

    @property
    def attn_dp_size(self) -> int:
        return self.attention_data_parallel or 1


def _known_parser(value: str | None, names: tuple[str, ...], kind: str) -> str | None:
    if value is None or value == NO_PARSER or value in names:
        return value
    choices = f"{', '.join(sorted(names))}, or {NO_PARSER!r}"
    if value == AUTO_PARSER:
        # SGLang accepts it and picks a parser from the chat template at start-up (parser/template_detection.py).
        raise ValueError(
            f"{AUTO_PARSER!r} lets SGLang pick the {kind} parser from the chat template when it starts; a run names "
            f"its parser so that the parser check and the canary hold the server to it: leave it unset (the "
            f"preset's) or use one of: {choices}"
        )
    raise ValueError(f"{value!r} is not a {kind} parser of the pinned SGLang; use one of: {choices}")


SAMPLE_ONE_OF = "set exactly one of count, fraction"


class DatasetSample(SpecModel):
    """A deterministic subset of the dataset (prompts/draws.py): the lines whose seeded hash of their id is among
    the lowest, so the subset depends on neither the file's order nor the shard count, and a resume draws it again."""

    model_config = ConfigDict(
        json_schema_extra={  # the CRD's rule; _exactly_one says the same for `datagen validate`
            "x-kubernetes-validations": [
                {"rule": "has(self.count) != has(self.fraction)", "message": SAMPLE_ONE_OF},
            ]
        },
    )

    count: int | None = Field(
        default=None,
        ge=1,
        description="Prompts to keep; a dataset with fewer valid prompts is taken whole (the preflight says so).",
    )
    fraction: float | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False, description="The share of lines to keep, 0 < fraction <= 1."
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Another seed draws another subset.")

    @model_validator(mode="after")
    def _exactly_one(self) -> DatasetSample:
        if (self.count is None) == (self.fraction is None):
            raise ValueError(SAMPLE_ONE_OF)
        return self


class DatasetSpec(SpecModel):
    path: str = Field(
        min_length=1,
        description="JSONL, a JSON array file or Parquet of conversations: `messages` or `conversations`, OpenAI "
        "{role, content} or ShareGPT {from, value}, `tools` optional (docs/regenerate.md).",
    )
    volume: VolumeSource | None = None
    format: Literal["auto", "jsonl", "json", "parquet"] = "auto"
    id_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The field holding each conversation's id (default `id`). A line without one gets an id "
        "derived from its content, which survives reordering of the file.",
    )
    sample: DatasetSample | None = Field(
        default=None,
        description="Generate for a seeded subset of the dataset only (`count` or `fraction`, and `seed`): pinned "
        "as a subset of the pinned dataset, so a resume and verify hold the same lines (docs/regenerate.md).",
    )


GREEDY_TEMPERATURE = 1e-6
"""SGLang 0.5.23's `_SAMPLING_EPS`: a temperature below it is greedy (top_k 1)."""


def is_greedy(temperature: float | None, top_k: int | None) -> bool:
    """Whether SGLang 0.5.23 samples greedily (`SamplingParams.normalize`: a temperature below its epsilon becomes
    top_k 1; `is_all_greedy`: top_k <= 1 is the argmax): every sample of a prompt is then the same answer. An
    unset temperature is SGLang's default 1.0 (/generate never takes the model's generation_config)."""
    return (temperature is not None and temperature < GREEDY_TEMPERATURE) or top_k == 1


def greedy_samples_problem(samples: int) -> str:
    """The spec's side of the identical-samples rule (checks.evaluate IDENTICAL_SAMPLES): known from the spec
    alone, so refused before any server starts."""
    return (
        f"samplesPerPrompt {samples} with greedy sampling (temperature 0 or top_k 1): SGLang answers every sample "
        "of a prompt alike; set generation.sampling.temperature above 0 (and top_k other than 1), or "
        "samplesPerPrompt: 1"
    )


class SamplingParams(BaseModel):
    """SGLang /generate sampling_params, spelled as SGLang spells them (max_new_tokens, not max_tokens)."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        json_schema_extra={  # the CRD's rules; _sglang_cross_field_bounds checks the same for `datagen validate`
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.top_k) || self.top_k != 0 || (has(self.temperature) && self.temperature < 1e-6)",
                    "message": "top_k must be -1 (the whole vocabulary) or at least 1; SGLang refuses 0",
                    "fieldPath": ".top_k",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.min_new_tokens) || self.min_new_tokens <= self.max_new_tokens",
                    "message": "min_new_tokens must be at most max_new_tokens",
                    "fieldPath": ".min_new_tokens",
                    "reason": "FieldValueInvalid",
                },
            ]
        },
    )

    # Ranges are those of SGLang 0.5.23's SamplingParams.verify, which refuses a request outside them
    # (tests/contract/test_spec_sampling.py holds them to SGLang's own code). One deliberate difference:
    # max_new_tokens 0 is accepted by SGLang but makes no data.
    max_new_tokens: int = Field(ge=1, description="Always sent: SGLang's default is only 128.")
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, description="-1 (the whole vocabulary) or at least 1.")
    min_p: float | None = Field(default=None, ge=0, le=1)
    min_new_tokens: int | None = Field(default=None, ge=0, description="At most max_new_tokens.")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=2, description="1.0 is no penalty.")
    stop_token_ids: list[int] | None = None
    sampling_seed: int | None = Field(
        default=None,
        ge=-(2**63),
        le=2**63 - 1,
        description="Reproducible samples: the server is then launched with --enable-deterministic-inference "
        "(SGLang ignores the seed without it); sample k of a prompt is sent with seed + k.",
    )

    def restarted_by_retraction(self) -> tuple[str, ...]:
        """The parameters whose state SGLang builds from the tokens generated so far and starts again after a
        retraction (`Req.reset_for_retract`, then a fresh penalizer in `SamplingBatchInfo.from_schedule_batch`):
        the penalties counted over the output, and min_new_tokens' count of new tokens. Each is the one whose
        penalizer SGLang 0.5.23 runs (`_is_required`): tests/contract/test_retraction.py holds them to it."""
        names = []
        if self.frequency_penalty not in (None, 0.0):
            names.append("frequency_penalty")
        if self.presence_penalty not in (None, 0.0):
            names.append("presence_penalty")
        if self.repetition_penalty not in (None, 1.0):
            names.append("repetition_penalty")
        if self.min_new_tokens not in (None, 0):
            names.append("min_new_tokens")
        return tuple(names)

    @property
    def greedy(self) -> bool:
        """SGLang takes the argmax: every request of a prompt gets the same answer (`is_greedy`)."""
        return is_greedy(self.temperature, self.top_k)

    @model_validator(mode="after")
    def _sglang_cross_field_bounds(self) -> SamplingParams:
        # SGLang turns temperature 0 into greedy sampling (top_k 1) before checking top_k.
        greedy = self.temperature is not None and self.temperature < GREEDY_TEMPERATURE
        if self.top_k == 0 and not greedy:
            raise cross_field_error("top_k", "top_k must be -1 (the whole vocabulary) or at least 1; SGLang refuses 0")
        if self.min_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise cross_field_error(
                "min_new_tokens", f"min_new_tokens must be at most max_new_tokens ({self.max_new_tokens})"
            )
        return self


class TemplateVariableChoice(SpecModel):
    value: Any = Field(
        description="The variable's value (any JSON value: a string, number, boolean...).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    weight: float = Field(gt=0, allow_inf_nan=False, description="Relative weight (4, 4, 2: 40%, 40%, 20%).")

    @field_validator("value")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("a value is required (null renders as an unset variable: leave the choice out)")
        return value


class TemplateVariableMix(SpecModel):
    """Chat-template variables drawn per line from weighted choices (prompts/draws.py), seeded by the line's id."""

    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Another seed draws other values.")
    variables: dict[str, Annotated[list[TemplateVariableChoice], Field(min_length=1)]] = Field(
        min_length=1,
        description="Variable name -> its weighted choices, e.g. reasoning_effort: [{value: low, weight: 4}, "
        "{value: medium, weight: 4}, {value: high, weight: 2}].",
    )


HistoryReasoning = Literal["keep", "drop"]
"""generation.historyReasoning (prompts/conversation.py `client_messages`)."""


class GenerationSpec(SpecModel):
    # The CRD's rule, beside _samples_can_differ that checks the same for `datagen validate`.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.samplesPerPrompt) || self.samplesPerPrompt <= 1 || !("
                    "(has(self.sampling.temperature) && self.sampling.temperature < 1e-6) || "
                    "(has(self.sampling.top_k) && self.sampling.top_k == 1))",
                    "message": greedy_samples_problem(2).replace("samplesPerPrompt 2", "samplesPerPrompt > 1"),
                    "fieldPath": ".samplesPerPrompt",
                    "reason": "FieldValueInvalid",
                }
            ]
        }
    )

    thinking: bool | None = Field(
        default=None, description="Render prompts with thinking on. Default: the preset's default."
    )
    sampling: SamplingParams
    samples_per_prompt: int = Field(default=1, ge=1, le=1024, description="Records per prompt (sample index 0..n-1).")
    template_variables: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat-template variables for every prompt (e.g. gpt-oss reasoning_effort); a dataset line's "
        "own chat_template_kwargs are rendered over them. The thinking switch is generation.thinking.",
        # Free-form: the API server keeps the values (CEL cannot read the keys of such an object, so the two rules on
        # them are resolve.py's alone: datagen validate and the operator's InvalidSpec, not the CRD).
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    template_variable_mix: TemplateVariableMix | None = Field(
        default=None,
        description="Template variables drawn per line from weighted choices, seeded (a resume draws the same), "
        "rendered as the line's own chat_template_kwargs would be; a line's own value of the variable wins. Not a "
        "variable of templateVariables (docs/regenerate.md).",
    )
    turns: Literal["last", "all"] = Field(
        default="last",
        description="`last`: one answer per line, to its last user message (a trailing assistant turn is dropped). "
        "`all`: the dataset's assistant turns are not sent; every user turn is answered in order, each on the "
        "model's own earlier answers (docs/regenerate.md).",
    )
    history_reasoning: HistoryReasoning = Field(
        default="keep",
        description="What earlier assistant messages a request sends (the model's own answers with turns all, the "
        "dataset's with last): `keep`: each with its reasoning_content, as SGLang's chat endpoint returned it, and "
        "the chat template decides what the prompt holds; `drop`: without it, as SpecForge's regenerate_train_data.py "
        "sends them. Same prompts for templates that drop earlier reasoning; not for Kimi-K2-Thinking's or Qwen3's "
        "(docs/regenerate.md, History reasoning).",
    )
    stream: bool = Field(
        default=False,
        description="Stream responses (incremental deltas; the server gets --incremental-streaming-output).",
    )

    @model_validator(mode="after")
    def _samples_can_differ(self) -> GenerationSpec:
        if self.samples_per_prompt > 1 and self.sampling.greedy:
            raise cross_field_error("samplesPerPrompt", greedy_samples_problem(self.samples_per_prompt))
        return self


AUTO_CONCURRENCY: Literal["auto"] = "auto"
"""clients.concurrency sized by the canary from the servers' batch limits (checks/batch_fill.py)."""
DEFAULT_CONCURRENCY = 64
MAX_CONCURRENCY = 4096
CONCURRENCY_PROBLEM = (
    f"an integer 1..{MAX_CONCURRENCY} (requests in flight per shard) or `{AUTO_CONCURRENCY}` (as many as fill the "
    "servers' batches, from their /server_info; docs/worker.md)"
)


def _concurrency(value: Any) -> int | Literal["auto"]:
    """Strict, as the CRD's int-or-string rule is: the string "64" is neither form."""
    if value == AUTO_CONCURRENCY:
        return AUTO_CONCURRENCY
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CONCURRENCY:
        return value
    raise ValueError(f"{value!r} is not {CONCURRENCY_PROBLEM}")


Concurrency = Annotated[
    int | Literal["auto"],
    PlainValidator(_concurrency),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "x-kubernetes-validations": [  # _concurrency says the same for `datagen validate`
                {
                    "rule": f"type(self) == int ? self >= 1 && self <= {MAX_CONCURRENCY} : self == '{AUTO_CONCURRENCY}'",
                    "message": f"must be {CONCURRENCY_PROBLEM}",
                }
            ],
        }
    ),
]


class ClientsSpec(SpecModel):
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS, description="Worker shards (Indexed Job completions).")
    concurrency: Concurrency = Field(
        default=DEFAULT_CONCURRENCY,
        description="In-flight requests per shard, or `auto`: the canary sizes it to fill the servers' batches "
        "(their max_running_requests and token pool, from /server_info) and the workers send at that number.",
    )
    image: str | None = Field(default=None, description="Worker image; default from the operator's configuration.")
    request_timeout: Duration = Field(
        default="1h", validate_default=True, description="Per-request timeout (long answers take minutes)."
    )
    max_attempts: int = Field(default=8, ge=1, le=100, description="Tries per record for retryable errors.")
    cpu: str | None = Field(default=None, pattern=CPU_PATTERN)
    memory: str | None = Field(default=None, pattern=QUANTITY_PATTERN)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels for the preflight, canary, worker and verify pods (CPU)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations of the preflight, canary, worker and verify pods."
    )

    def per_shard(self, resolved: int | None) -> int:
        """The requests in flight per shard the workers send at: the spec's number; with auto the one the canary
        resolved (`resolved`), else the default (a spec changed to auto after its canary ran)."""
        if isinstance(self.concurrency, int):
            return self.concurrency
        return resolved if resolved is not None else DEFAULT_CONCURRENCY


class OutputSpec(SpecModel):
    path: str = Field(min_length=1, description="Output directory (inside the volume); never deleted by the operator.")
    volume: VolumeSource | None = None


class ChecksSpec(SpecModel):
    canary_prompts: int = Field(default=8, ge=0, le=256, description="Dataset prompts in the canary (plus probes).")
    canary_max_new_tokens: int = Field(
        default=2048,
        ge=16,
        description="max_new_tokens for canary requests (capped so the verdict comes within a minute on a GPU).",
    )
    min_reasoning_rate: float = Field(default=0.98, ge=0, le=1)
    max_truncation_rate: float = Field(default=0.02, ge=0, le=1)
    max_identical_sample_rate: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="With samplesPerPrompt > 1 and temperature > 0: prompts whose samples all came back identical "
        "(first turns), out of the prompts with two or more. SGLang samples each request anew, so a high rate is a "
        "seeding mistake (a fixed sampling_seed under deterministic inference) or a greedy server.",
    )
    max_retraction_rate: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Records SGLang retracted (KV memory ran short) while penalties or min_new_tokens were set: "
        "their penalty state restarted, so they were not sampled as asked.",
    )
    max_token_mismatch_rate: float = Field(default=0.0, ge=0, le=1)
    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="Records rejected by the server (4xx).")
    fidelity_sample: int = Field(default=64, ge=0, description="Records re-rendered to prove prompt fidelity.")
    on_failure: Literal["Halt", "Warn"] = Field(
        default="Halt", description="Halt stops before bulk work (canary) or pauses workers (rolling checks)."
    )


def _record_flag(value: str) -> str:
    problem = unknown_flags_problem([value])
    if problem is not None:
        raise ValueError(problem)
    return value


RecordFlag = Annotated[str, AfterValidator(_record_flag), WithJsonSchema({"type": "string", "enum": list(ALL_FLAGS)})]
"""One of the record flags (api/flags.py): the CRD holds them as an enum, `datagen validate` names the wrong one."""


class ExportSpec(SpecModel):
    formats: list[Literal["speculators", "trl", "text", "conversations"]] = Field(
        min_length=1,
        max_length=4,
        description="Trainer formats to write once the final verification passes (conversations: the regenerated "
        "conversations as text, generation.turns all).",
    )
    rows: Literal["turns", "conversations"] = Field(
        default="turns",
        description="turns: a row per recorded turn; conversations (generation.turns all): a row per whole "
        "conversation, the loss over every answer it holds verbatim (docs/export.md).",
    )
    rerendered_spans: Literal["unmasked", "drop-row"] = Field(
        default="unmasked",
        description="A conversation row holding an earlier answer the template re-rendered: keep that span unmasked "
        "(counted) or leave the conversation out (counted).",
    )
    path: str = Field(
        default="export",
        pattern=SUB_PATH_PATTERN,
        max_length=253,
        description="Folder inside the run's output directory; each format goes to PATH/<format>.",
    )
    max_length: int | None = Field(default=None, ge=1, description="Rows longer than this are left out.")
    exclude_flags: list[RecordFlag] = Field(
        default_factory=list, max_length=32, description="Record flags to leave out, e.g. truncated."
    )


KUEUE_NAME_MAX_LENGTH = 63
"""A Kueue object's name as its label holds it: a DNS-1123 subdomain (Kueue's own check) no longer than a label
value may be."""


class QueueSpec(SpecModel):
    """Kueue (docs/kueue.md): the LocalQueue that admits the run's server, all its pods as one unit, and its
    priority. Unset: no Kueue labels (a `default` LocalQueue in the namespace is still Kueue's own rule)."""

    name: str = Field(
        max_length=KUEUE_NAME_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="The LocalQueue in the run's namespace (Kueue's label kueue.x-k8s.io/queue-name).",
    )
    workload_priority_class_name: str | None = Field(
        default=None,
        max_length=KUEUE_NAME_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="A Kueue WorkloadPriorityClass (label kueue.x-k8s.io/priority-class): the order in the queue "
        "and who may preempt whom. Not the pods' PriorityClass (server.priorityClassName).",
    )


class DataGenRunSpec(SpecModel):
    model: ModelSpec
    server: ServerSpec = Field(default_factory=ServerSpec)
    dataset: DatasetSpec
    generation: GenerationSpec
    clients: ClientsSpec = Field(default_factory=ClientsSpec)
    output: OutputSpec
    checks: ChecksSpec = Field(default_factory=ChecksSpec)
    export: ExportSpec | None = Field(default=None, description="Export the verified records (docs/export.md).")
    suspend: bool = Field(default=False, description="Suspend (Kueue style): releases the GPUs, keeps the output.")
    queue: QueueSpec | None = Field(
        default=None,
        description="Queue the server in Kueue (docs/kueue.md); unset, the run is not labelled for it. Ignored by "
        "`datagen run` on one machine.",
    )


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _children_can_be_named(cls, value: str) -> str:
        problem = run_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class DataGenRun(BaseModel):
    """A whole manifest (apiVersion, kind, metadata, spec) as `datagen validate` reads it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: ApiGroupVersion = Field(alias="apiVersion")
    kind: Literal["DataGenRun"]
    metadata: ObjectMeta
    spec: DataGenRunSpec
    status: dict[str, Any] | None = None
