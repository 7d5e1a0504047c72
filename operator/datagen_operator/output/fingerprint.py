"""The data fingerprint: what must not change between the records of one output directory.

Chat-template drift between generation and training silently corrupts drafter data (SpecForge issue 296 and
PR 182, github.com/sgl-project/SpecForge), so every output records the sha256 of the tokenizer files and of the
chat template, the server's version and data-affecting args (from its own /server_info), the sampling params,
preset and thinking switch.
A worker refuses to resume into an output whose fingerprint differs, and says what changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

if TYPE_CHECKING:  # the spec models load pydantic; the fingerprint is read by light tools too
    from datagen_operator.api.generation_spec import DatasetSample, HistoryReasoning, TemplateVariableMix

# Files that decide how text becomes ids (never weights: a model dir holds hundreds of GB of them).
TOKENIZER_FILE_PATTERNS: tuple[str, ...] = (
    "tokenizer*", "*.tiktoken", "tiktoken.model", "*.model", "vocab.*", "merges.txt", "added_tokens.json",
    "special_tokens_map.json", "chat_template*", "tokenization_*.py",
)  # fmt: skip
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")

# /server_info keys (ServerArgs fields, `resolved_dict()`) that change which tokens the model writes, each with
# the SGLang flag that sets it: the model's definition, the numeric formats it is stored and run in, and the
# decoding algorithm. Everything else (addresses, timestamps, parallelism, kernels and backends that compute
# the same layer at the same precision, memory sizes measured from free GPU memory at start, parsers the
# native /generate never runs, the per-launch random seed) differs between replicas and restarts with the
# same data, and must not refuse a resume. The review of every flag: docs/data-args.md; flags that change
# the data without a spec field to say so are refused in extraArgs instead (api/extra_args.py).
DATA_SERVER_ARGS: dict[str, str] = {
    # the model's definition
    "revision": "--revision",
    "json_model_override_args": "--json-model-override-args",
    "model_config_parser": "--model-config-parser",
    "context_length": "--context-length",
    "load_format": "--load-format",
    "chat_template": "--chat-template",
    "skip_tokenizer_init": "--skip-tokenizer-init",
    # numeric formats of weights, activations, caches and communication
    "dtype": "--dtype",
    "quantization": "--quantization",
    "quantization_param_path": "--quantization-param-path",
    "modelopt_quant": "--modelopt-quant",
    "modelopt_checkpoint_restore_path": "--modelopt-checkpoint-restore-path",
    "rl_quant_profile": "--rl-quant-profile",
    "kv_cache_dtype": "--kv-cache-dtype",
    "prefill_kv_cache_dequant_dtype": "--prefill-kv-cache-dequant-dtype",
    "enable_fp32_lm_head": "--enable-fp32-lm-head",
    "enable_tf32_matmul": "--enable-tf32-matmul",
    "enable_quant_communications": "--enable-quant-communications",
    "flashinfer_mxfp4_moe_precision": "--flashinfer-mxfp4-moe-precision",
    "deepep_dispatcher_output_dtype": "--deepep-dispatcher-output-dtype",
    "flashinfer_a2a_dispatch_type": "--flashinfer-a2a-dispatch-type",
    "enable_w4a4_mxfp4_megamoe": "--enable-w4a4-mxfp4-megamoe",
    "enforce_shared_experts_fusion": "--enforce-shared-experts-fusion",
    "mamba_ssm_dtype": "--mamba-ssm-dtype",
    "enable_mamba_cache_stochastic_rounding": "--enable-mamba-cache-stochastic-rounding",
    "enable_int8_mamba_checkpoint": "--enable-int8-mamba-checkpoint",
    "qsa_indexer_dtype": "--qsa-indexer-dtype",
    "enable_deepseek_v4_fp4_indexer": "--enable-deepseek-v4-fp4-indexer",
    "dsv4_prefill_backend": "--dsv4-prefill-backend",
    "kt_weight_path": "--kt-weight-path",
    "kt_method": "--kt-method",
    "kt_num_gpu_experts": "--kt-num-gpu-experts",
    "kt_max_deferred_experts_per_token": "--kt-max-deferred-experts-per-token",
    # the decoding algorithm
    "enable_hisparse": "--enable-hisparse",
    "hisparse_config": "--hisparse-config",
    "dllm_algorithm": "--dllm-algorithm",
    "dllm_algorithm_config": "--dllm-algorithm-config",
    "speculative_algorithm": "--speculative-algorithm",
    "speculative_use_rejection_sampling": "--speculative-use-rejection-sampling",
    "sampling_backend": "--sampling-backend",
    "enable_deterministic_inference": "--enable-deterministic-inference",
    # refused in extraArgs, recorded too: a worker may be pointed at a server started by hand
    "preferred_sampling_params": "--preferred-sampling-params",
    "rl_on_policy_target": "--rl-on-policy-target",
    "enable_strict_thinking": "--enable-strict-thinking",
    "enable_watermark": "--enable-watermark",
    "speculative_accept_threshold_single": "--speculative-accept-threshold-single",
    "speculative_accept_threshold_acc": "--speculative-accept-threshold-acc",
    "forward_hooks": "--forward-hooks",
}
DATA_SERVER_KEYS: tuple[str, ...] = tuple(DATA_SERVER_ARGS)


def tokenizer_files(tokenizer_dir: Path) -> list[Path]:
    files = []
    for path in sorted(tokenizer_dir.iterdir()):
        if not path.is_file() or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        if any(fnmatch.fnmatch(path.name, pattern) for pattern in TOKENIZER_FILE_PATTERNS):
            files.append(path)
    return files


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer_dir: Path) -> dict[str, Any]:
    hashes = {path.name: sha256_bytes(path.read_bytes()) for path in tokenizer_files(tokenizer_dir)}
    return {"files": hashes, "sha256": sha256_bytes(orjson.dumps(hashes, option=orjson.OPT_SORT_KEYS))}


def chat_template_sha256(template: str | dict[str, str] | None) -> str | None:
    if template is None:
        return None
    data = template.encode() if isinstance(template, str) else orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    return sha256_bytes(data)


def server_fingerprint(server_info: dict[str, Any]) -> dict[str, Any]:
    """The server's version and its data-affecting args (an allowlist: an unknown key never refuses a resume)."""
    args = {key: server_info.get(key) for key in DATA_SERVER_KEYS}
    return {"version": server_info.get("version"), "args": args}


def build_fingerprint(
    *,
    tokenizer: dict[str, Any],
    chat_template: str | None,
    server: dict[str, Any],
    sampling: dict[str, Any],
    preset: str | None,
    thinking: bool,
    turns: str = "last",
    template_variables: dict[str, Any] | None = None,
    history_reasoning: str = "keep",
    dataset_sample: DatasetSample | None = None,
    template_variable_mix: TemplateVariableMix | None = None,
) -> dict[str, Any]:
    """Samples per prompt is deliberately not part of it: raising it later extends a run (sample k is
        sent with seed + k either way). generation.templateVariables are, when set (a line's own are in the line,
    held by the dataset pin). `turns` is, when `all`: one output holds one answer per line or whole
        regenerated conversations, never both (an output of one answer per line keeps its fingerprint).
    generation.historyReasoning is, when `drop`: it changes what a later prompt holds (an output made before the
    field existed sent reasoning back, `keep`, and keeps its fingerprint). dataset.sample and
    generation.templateVariableMix are, when set, under their spec names (a changed one is named so): the pin holds
    the whole dataset, these which of its lines and which variables each line was drawn."""
    return {
        "tokenizer": tokenizer,
        "chat_template_sha256": chat_template,
        "server": server,
        "sampling": dict(sorted(sampling.items())),
        "preset": preset,
        "thinking": thinking,
        **({"turns": turns} if turns != "last" else {}),
        **({"template_variables": dict(sorted(template_variables.items()))} if template_variables else {}),
        **({HISTORY_REASONING_KEY: history_reasoning} if history_reasoning != "keep" else {}),
        **({DATASET_SAMPLE_KEY: _spec_part(dataset_sample)} if dataset_sample is not None else {}),
        **({TEMPLATE_VARIABLE_MIX_KEY: _spec_part(template_variable_mix)} if template_variable_mix is not None else {}),
    }


DATASET_SAMPLE_KEY = "dataset.sample"
TEMPLATE_VARIABLE_MIX_KEY = "generation.templateVariableMix"


def _spec_part(model: Any) -> dict[str, Any]:
    """A spec section as the manifest spells it (camelCase, unset fields left out)."""
    part: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return part


HISTORY_REASONING_KEY = "history_reasoning"
"""generation.historyReasoning in the fingerprint; absent: `keep`."""


def fingerprint_history_reasoning(fingerprint: dict[str, Any]) -> HistoryReasoning:
    """What history an output's requests sent (for verify without the run's spec)."""
    value = fingerprint.get(HISTORY_REASONING_KEY, "keep")
    if value not in ("keep", "drop"):
        raise ValueError(f"the output's fingerprint says {HISTORY_REASONING_KEY}: {value!r}, not keep or drop")
    return cast("HistoryReasoning", value)


def prelaunch_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between an output's fingerprint and the run's, on everything known before a server runs
    (tokenizer files, chat template, sampling, preset, thinking): a refused resume costs no model load."""
    return diff_fingerprints(_without_server(recorded), _without_server(current))


def _without_server(fingerprint: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fingerprint.items() if k != "server"}


def fingerprint_sha256(fingerprint: dict[str, Any]) -> str:
    return sha256_bytes(orjson.dumps(fingerprint, option=orjson.OPT_SORT_KEYS))


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


_MISSING = object()


def diff_fingerprints(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human lines naming each changed field: `sampling.temperature: 0.6 -> 0.7`."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(recorded, "", old)
    _flatten(current, "", new)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, _MISSING), new.get(key, _MISSING)
        if before == after or key == "tokenizer.sha256":
            continue
        show_before = "(absent)" if before is _MISSING else _short(before)
        show_after = "(absent)" if after is _MISSING else _short(after)
        lines.append(f"{key}: {show_before} -> {show_after}")
    return lines


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + "…"
    return text if len(text) <= 120 else text[:117] + "..."
