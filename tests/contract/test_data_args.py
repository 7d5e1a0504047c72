"""The data-changing server args, against SGLang's own parser (pinned wheel): every flag our tables name is
one of its flags, each fingerprinted flag lands in the ServerArgs field `/server_info` reports under the key
the fingerprint reads, and the prefix refusal of extraArgs matches how SGLang's parser reads abbreviations.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from datagen_operator.api.extra_args import (
    MANAGED_FLAGS,
    REFUSED_FLAGS,
    SPECULATIVE_FLAG,
    SPECULATIVE_INEXACT_SAMPLING,
    read_as,
)
from datagen_operator.output.fingerprint import DATA_SERVER_ARGS
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

TABLE_FLAGS = sorted(MANAGED_FLAGS | set(REFUSED_FLAGS) | set(DATA_SERVER_ARGS.values()) | {SPECULATIVE_FLAG})

# A value each fingerprinted flag takes (none: a switch), other than SGLang's default for it.
EXAMPLE_VALUES: dict[str, list[str]] = {
    "revision": ["abc123"],
    "json_model_override_args": ['{"rope_theta": 1000000}'],
    "model_config_parser": ["mistral"],
    "context_length": ["32768"],
    "load_format": ["safetensors"],
    "chat_template": ["/templates/t.jinja"],
    "skip_tokenizer_init": [],
    "dtype": ["float16"],
    "quantization": ["fp8"],
    "quantization_param_path": ["/scales/kv.json"],
    "modelopt_quant": ["nvfp4"],
    "modelopt_checkpoint_restore_path": ["/ckpt/modelopt"],
    "rl_quant_profile": ["/profiles/flash_rl.json"],
    "kv_cache_dtype": ["fp8_e4m3"],
    "prefill_kv_cache_dequant_dtype": ["fp8_e4m3"],
    "enable_fp32_lm_head": [],
    "enable_tf32_matmul": [],
    "enable_quant_communications": [],
    "flashinfer_mxfp4_moe_precision": ["bf16"],
    "deepep_dispatcher_output_dtype": ["fp8"],
    "flashinfer_a2a_dispatch_type": ["nvfp4"],
    "enable_w4a4_mxfp4_megamoe": [],
    "enforce_shared_experts_fusion": [],
    "mamba_ssm_dtype": ["float16"],
    "enable_mamba_cache_stochastic_rounding": [],
    "enable_int8_mamba_checkpoint": [],
    "qsa_indexer_dtype": ["fp8_e4m3"],
    "enable_deepseek_v4_fp4_indexer": [],
    "dsv4_prefill_backend": ["flashmla_sparse_q8"],
    "kt_weight_path": ["/kt/weights"],
    "kt_method": ["AMXINT8"],
    "kt_num_gpu_experts": ["16"],
    "kt_max_deferred_experts_per_token": ["2"],
    "enable_hisparse": [],
    "hisparse_config": ['{"top_k": 1024}'],
    "dllm_algorithm": ["LowConfidence"],
    "dllm_algorithm_config": ["/dllm/config.yaml"],
    "speculative_algorithm": ["EAGLE"],
    "speculative_use_rejection_sampling": [],
    "sampling_backend": ["flashinfer"],
    "enable_deterministic_inference": [],
    "preferred_sampling_params": ['{"temperature": 0.3}'],
    "rl_on_policy_target": ["fsdp"],
    "enable_strict_thinking": [],
    "enable_watermark": [],
    "speculative_accept_threshold_single": ["0.5"],
    "speculative_accept_threshold_acc": ["0.5"],
    "forward_hooks": ['[{"name": "h", "target_modules": ["model.layers.0"], "hook_factory": "m:f"}]'],
}


@pytest.fixture(scope="module")
def sglang_flags(sglang: SGLang) -> dict[str, list[str]]:
    return dict(sglang.call(sglang_side.option_strings))


@pytest.fixture(scope="module")
def plain_server_info(sglang: SGLang) -> dict[str, Any]:
    """/server_info's server args for a launch with no data flag: SGLang's resolved defaults."""
    return dict(sglang.call(sglang_side.server_info_args, ["--model-path", str(sglang.model_dir)]))


@pytest.mark.parametrize("flag", TABLE_FLAGS)
def test_every_flag_of_our_tables_is_one_of_sglangs(sglang_flags: dict[str, list[str]], flag: str) -> None:
    """A typo or a flag SGLang renamed would refuse (or fingerprint) nothing."""
    assert any(flag in names for names in sglang_flags.values())


def test_no_flag_sglang_reads_exactly_is_a_prefix_of_a_table_flag(sglang_flags: dict[str, list[str]]) -> None:
    """extraArgs refuses prefixes of refused and managed flags; none of them may be a flag of its own."""
    tabled = MANAGED_FLAGS | set(REFUSED_FLAGS)
    own = {name for names in sglang_flags.values() for name in names} - tabled
    assert {name: read_as(name, tabled) for name in own if read_as(name, tabled)} == {}


@pytest.mark.parametrize(
    ("argv", "key", "expected"),
    [
        (["--preferred-sampling", '{"temperature": 0.3}'], "preferred_sampling_params", {"temperature": 0.3}),
        (["--enable-strict-think"], "enable_strict_thinking", True),
        (["--mem-fraction", "0.5"], "mem_fraction_static", 0.5),
        (["--speculative-algo=EAGLE"], "speculative_algorithm", "EAGLE"),
    ],
)
def test_sglang_reads_an_abbreviated_flag_as_the_flag(sglang: SGLang, argv: list[str], key: str, expected: Any) -> None:
    """Why extraArgs refuses prefixes: SGLang's parser takes them (argparse's allow_abbrev)."""
    parsed = sglang.call(sglang_side.parsed_fields, ["--model-path", str(sglang.model_dir), *argv], [key])
    assert parsed == {key: expected}


def test_every_fingerprinted_key_has_an_example() -> None:
    assert sorted(EXAMPLE_VALUES) == sorted(DATA_SERVER_ARGS)


@pytest.mark.parametrize("key", list(DATA_SERVER_ARGS))
def test_a_fingerprinted_flag_lands_under_the_key_server_info_reports(
    sglang: SGLang, sglang_flags: dict[str, list[str]], plain_server_info: dict[str, Any], key: str
) -> None:
    flag, values = DATA_SERVER_ARGS[key], EXAMPLE_VALUES[key]
    assert flag in sglang_flags.get(key, []), f"SGLang's parser stores {flag} elsewhere: {sglang_flags.get(key)}"
    assert key in plain_server_info, f"/server_info has no {key}"
    parsed = sglang.call(sglang_side.parsed_fields, ["--model-path", str(sglang.model_dir), flag, *values], [key])
    assert "exit" not in parsed, f"SGLang's parser refused {flag} {values}"
    expected = [True] if not values else [values[0], json.loads(values[0]) if _is_json(values[0]) else values[0]]
    assert parsed[key] in expected
    assert parsed[key] != plain_server_info[key], "the example is SGLang's default: the test would prove nothing"


@pytest.mark.parametrize(("key", "neutral"), list(SPECULATIVE_INEXACT_SAMPLING.items()))
def test_the_speculative_sampling_keys_are_sglangs(sglang: SGLang, key: str, neutral: float) -> None:
    """The sampling keys refused under speculative decoding are SGLang's own, and their neutral value is one it
    takes (an unknown key is a TypeError, a bad value a ValueError)."""
    verdict = sglang.call(sglang_side.sampling_verdict, {"max_new_tokens": 8, key: neutral}, sglang_side.VOCAB_SIZE)
    assert verdict is None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
