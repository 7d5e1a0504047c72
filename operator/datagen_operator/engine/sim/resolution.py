"""What SGLang 0.5.23's argument resolution (`ServerArgs.resolve_once`) makes of the flags the simulator takes.

`/server_info` reports every resolved `ServerArgs` field (`resolved_dict()`); the simulator reports the ones
the project reads: the layout (`dp_size`, `attn_dp_size`, `enable_dp_attention`), the speculative config, and
every field the output fingerprint keeps (`output/fingerprint.py`), at SGLang's resolved default unless a
flag sets it. Values are those of SGLang's CUDA image on a Hopper GPU (flashinfer installed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class LaunchError(ValueError):
    """SGLang's resolution refuses the launch: it raises before serving, and the server exits 1."""


# The choices of SGLang's CLI parser for the format flags the simulator takes (`arg_groups/choices.py`).
DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")
QUANTIZATION_CHOICES = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "w4afp8",
    "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim", "mxfp_w4a8", "quark",
    "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)  # fmt: skip
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")

# Fingerprinted fields the simulator has no flag for, at their resolved defaults.
DATA_ARG_DEFAULTS: dict[str, Any] = {
    "json_model_override_args": "{}", "model_config_parser": "auto", "load_format": "auto",
    "quantization_param_path": None, "modelopt_quant": None, "modelopt_checkpoint_restore_path": None,
    "rl_quant_profile": None, "prefill_kv_cache_dequant_dtype": "auto", "enable_fp32_lm_head": False,
    "enable_tf32_matmul": False, "enable_quant_communications": False, "flashinfer_mxfp4_moe_precision": "default",
    "deepep_dispatcher_output_dtype": "auto", "flashinfer_a2a_dispatch_type": None, "enable_w4a4_mxfp4_megamoe": False,
    "enforce_shared_experts_fusion": False, "mamba_ssm_dtype": None, "enable_mamba_cache_stochastic_rounding": False,
    "enable_int8_mamba_checkpoint": False, "qsa_indexer_dtype": "auto", "enable_deepseek_v4_fp4_indexer": False,
    "dsv4_prefill_backend": "auto", "kt_weight_path": None, "kt_method": "AMXINT4", "kt_num_gpu_experts": None,
    "kt_max_deferred_experts_per_token": None, "enable_hisparse": False, "hisparse_config": None,
    "dllm_algorithm": None, "dllm_algorithm_config": None, "speculative_use_rejection_sampling": False,
    "preferred_sampling_params": None, "rl_on_policy_target": None, "enable_strict_thinking": False,
    "enable_watermark": False, "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0,
    "forward_hooks": None,
}  # fmt: skip
# The model overrides that turn TF32 matmuls on for the gate GEMMs (`model_overrides/glm4_moe.py`, `minimax_m2.py`).
TF32_ARCHITECTURES = frozenset({"Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM"})


def sampling_backend(deterministic: bool) -> str:
    """flashinfer where it is installed, pytorch under --enable-deterministic-inference (`overrides.py`)."""
    return "pytorch" if deterministic else "flashinfer"


def data_parallel(tp_size: int, dp_size: int, attn_dp_size: int, enable_dp_attention: bool) -> tuple[int, int]:
    """(dp_size, attn_dp_size) as resolved (`parallel_hook.py`): the deprecated `--dp-size N --enable-dp-attention`
    is `--attn-dp-size N`; replicas and attention DP together, or groups that do not divide the TP group, are refused."""
    if enable_dp_attention and attn_dp_size == 1:
        dp_size, attn_dp_size = 1, dp_size
    if attn_dp_size < 1:
        raise LaunchError(f"--attn-dp-size must be positive (got {attn_dp_size}).")
    if attn_dp_size > 1 and dp_size > 1:
        raise LaunchError(
            f"--dp-size {dp_size} with --attn-dp-size {attn_dp_size}: data-parallel replicas combined with "
            "attention data parallelism are not supported."
        )
    if tp_size % attn_dp_size:  # an assertion in SGLang, without a message
        raise LaunchError(f"--tp-size {tp_size} is not divisible by --attn-dp-size {attn_dp_size}.")
    return dp_size, attn_dp_size


# Builtin algorithms (`SpeculativeAlgorithm`); NEXTN is EAGLE. The simulator resolves the EAGLE family and NGRAM.
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
SIMULATED_ALGORITHMS = (*EAGLE_FAMILY, "NGRAM")
OTHER_ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "FROZEN_KV_MTP")
# `_auto_choose_speculative_params`: these models draft 5 steps of 4 paths (8 tokens), the rest 3 of 1 (4).
WIDE_DRAFT_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})
NGRAM_BFS_BREADTH = 10
"""--speculative-ngram-max-bfs-breadth's default: NGRAM's draft tree width, reported as its eagle top-k."""


def speculative_algorithm(name: str | None) -> str | None:
    """The algorithm as resolved: upper-cased, NEXTN as EAGLE; an unknown name is refused."""
    if name is None:
        return None
    upper = "EAGLE" if name.upper() == "NEXTN" else name.upper()
    if upper in OTHER_ALGORITHMS:
        raise LaunchError(f"the simulator does not simulate --speculative-algorithm {name}")
    if upper not in SIMULATED_ALGORITHMS:
        raise LaunchError(f"Unknown speculative algorithm name: {upper}")
    return upper


def _eagle_params(
    algorithm: str, steps: int | None, topk: int | None, draft_tokens: int | None, architecture: str | None
) -> tuple[int, int, int]:
    """`_handle_eagle_family`: unset, all three are chosen for the model; with one top-k path the draft is
    always steps + 1 tokens."""
    if steps is None:
        if topk is not None or draft_tokens is not None:  # an assertion in SGLang
            raise LaunchError(
                "--speculative-eagle-topk and --speculative-num-draft-tokens need --speculative-num-steps"
            )
        wide = algorithm != "STANDALONE" and architecture in WIDE_DRAFT_ARCHITECTURES
        steps, topk, draft_tokens = (5, 4, 8) if wide else (3, 1, 4)
    if topk is None:  # SGLang compares the missing top-k with an int and fails
        raise LaunchError("--speculative-num-steps needs --speculative-eagle-topk")
    if topk == 1:
        draft_tokens = steps + 1
    if draft_tokens is None:  # SGLang's reservation takes max() of an int and None and fails
        raise LaunchError("--speculative-eagle-topk above 1 needs --speculative-num-draft-tokens")
    return steps, topk, draft_tokens


def _ngram_params(steps: int | None, draft_tokens: int | None) -> tuple[int, int, int]:
    """`_handle_ngram`: the top-k is the BFS breadth, 12 draft tokens unless given, steps from both."""
    draft_tokens = 12 if draft_tokens is None else draft_tokens
    return (draft_tokens // NGRAM_BFS_BREADTH if steps is None else steps), NGRAM_BFS_BREADTH, draft_tokens


def model_resolved(args: Mapping[str, Any], model_config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved fields that depend on the model's config.json (its architecture)."""
    architectures = model_config.get("architectures") or [None]
    architecture = architectures[0] if isinstance(architectures, list) else None
    resolved: dict[str, Any] = {"enable_tf32_matmul": architecture in TF32_ARCHITECTURES}
    algorithm = args["speculative_algorithm"]
    given = (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"])
    if algorithm in EAGLE_FAMILY:
        given = _eagle_params(algorithm, *given, architecture)
    elif algorithm == "NGRAM":
        given = _ngram_params(given[0], given[2])
    keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    return resolved | dict(zip(keys, given, strict=True))
