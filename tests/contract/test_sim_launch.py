"""The simulator's launch as SGLang's own resolution has it (pinned wheel): the server args `/server_info`
reports for every stand-in family (every fingerprinted field, the data-parallel layout, the speculative
config), the launches resolution refuses, the tokens speculative decoding reserves in the length checks, and
the sizes a data-parallel server reports. The simulator side is its pure functions (`engine/sim/config.py`,
`resolution.py`, `protocol.py`); tests/sim runs the same through a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.engine.limits import reserved_tokens
from datagen_operator.engine.sim import protocol, resolution
from datagen_operator.engine.sim.config import parse_settings
from datagen_operator.engine.sim.protocol import RequestError, parse_generate_request
from datagen_operator.engine.sim.vocab import SimVocab, load_vocab
from datagen_operator.output.fingerprint import DATA_SERVER_ARGS
from datagen_operator.tokenizer.families import FAMILIES
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.contract import sglang_sim_side
from tests.contract.conftest import SGLang

LAYOUT_KEYS = ("tp_size", "dp_size", "attn_dp_size", "enable_dp_attention")
SPECULATIVE_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                    "speculative_num_draft_tokens")  # fmt: skip
KEYS = sorted({*DATA_SERVER_ARGS, *LAYOUT_KEYS, *SPECULATIVE_KEYS})

# Launch flags (after --model-path) the simulator takes, each as SGLang resolves it.
LAUNCHES: dict[str, list[str]] = {
    "plain": [],
    "formats": ["--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3", "--revision", "abc"],
    "deterministic": ["--enable-deterministic-inference"],
    "replicas": ["--tp-size", "4", "--dp-size", "2"],
    "attn-dp": ["--tp-size", "8", "--attn-dp-size", "8"],
    "attn-dp-alias": ["--tp-size", "8", "--attention-data-parallel-size", "4"],
    "deprecated-dp-attention": ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"],
    "dp-attention-alone": ["--enable-dp-attention"],
    "eagle": ["--speculative-algorithm", "EAGLE"],
    "eagle3-lowercase": ["--speculative-algorithm", "eagle3"],
    "nextn": ["--speculative-algorithm", "NEXTN"],
    "eagle-tree": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5", "--speculative-eagle-topk",
                   "4", "--speculative-num-draft-tokens", "8"],
    "eagle-chain-draft-ignored": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                                  "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "9"],
    "standalone": ["--speculative-algorithm", "STANDALONE"],
    "ngram": ["--speculative-algorithm", "NGRAM"],
    "ngram-drafts": ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "25"],
    "eagle-attn-dp": ["--speculative-algorithm", "EAGLE", "--tp-size", "2", "--attn-dp-size", "2"],
}  # fmt: skip
REFUSED: dict[str, list[str]] = {
    "unknown-algorithm": ["--speculative-algorithm", "FOO"],
    "topk-without-steps": ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "2"],
    "steps-without-topk": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2"],
    "tree-without-draft-tokens": ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2",
                                  "--speculative-eagle-topk", "2"],
    "attn-dp-not-dividing-tp": ["--tp-size", "8", "--attn-dp-size", "3"],
    "attn-dp-with-replicas": ["--tp-size", "4", "--dp-size", "2", "--attn-dp-size", "2"],
    "attn-dp-zero": ["--attn-dp-size", "0"],
}  # fmt: skip


def _family_dir(family: str) -> Path:
    return ensure_standin_tokenizer(family=family)


def _sim_args(model_dir: Path, flags: list[str]) -> dict[str, Any]:
    """The server args the simulator reports for a launch: its flags, then what depends on the model."""
    args = parse_settings(["--model-path", str(model_dir), *flags]).server_args
    config = json.loads((model_dir / "config.json").read_text())
    return {**args, **resolution.model_resolved(args, config)}


def _sglang_args(sglang: SGLang, model_dir: Path, flags: list[str]) -> dict[str, Any]:
    argv = ["--model-path", str(model_dir), "--trust-remote-code", *flags]
    resolved = sglang.call(sglang_sim_side.launch_resolution, argv, KEYS)
    assert "refused" not in resolved and "exit" not in resolved, f"SGLang refused {flags}: {resolved}"
    return dict(resolved)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plain_launch_reports_every_fingerprinted_key_as_sglang_resolves_it(sglang: SGLang, family: str) -> None:
    """The fingerprint reads these keys from /server_info; a key the simulator left out reads as null."""
    model_dir = _family_dir(family)
    expected = _sglang_args(sglang, model_dir, [])
    sim = _sim_args(model_dir, [])
    assert {key: sim.get(key, "<missing>") for key in KEYS} == {key: expected[key] for key in KEYS}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_the_simulator_resolves_a_launch_as_sglang_does(sglang: SGLang, standin_tokenizer: Path, launch: str) -> None:
    flags = LAUNCHES[launch]
    expected = _sglang_args(sglang, standin_tokenizer, flags)
    sim = _sim_args(standin_tokenizer, flags)
    assert {key: sim[key] for key in KEYS} == {key: expected[key] for key in KEYS}
    assert reserved_tokens(sim) == expected["num_reserved_tokens"]


@pytest.mark.parametrize("launch", list(REFUSED))
def test_the_simulator_refuses_a_launch_sglang_refuses(sglang: SGLang, standin_tokenizer: Path, launch: str) -> None:
    flags = REFUSED[launch]
    verdict = sglang.call(sglang_sim_side.launch_resolution, ["--model-path", str(standin_tokenizer), *flags], KEYS)
    assert "refused" in verdict, f"SGLang resolved {flags}: {verdict}"
    with pytest.raises(resolution.LaunchError) as refusal:
        _sim_args(standin_tokenizer, flags)
    if verdict["refused"].startswith("ValueError: "):  # SGLang's own text; its assertions and crashes have none
        assert str(refusal.value) == verdict["refused"].removeprefix("ValueError: ")


def test_the_format_flags_take_sglangs_choices(sglang: SGLang) -> None:
    choices = sglang.call(sglang_sim_side.parser_choices, ["dtype", "quantization", "kv_cache_dtype"])
    ours = {"dtype": resolution.DTYPE_CHOICES, "quantization": resolution.QUANTIZATION_CHOICES,
            "kv_cache_dtype": resolution.KV_CACHE_DTYPE_CHOICES}  # fmt: skip
    assert {dest: list(values) for dest, values in ours.items()} == choices


# --- speculative decoding's reserved tokens in the tokenizer manager's length checks ----------------------

CONTEXT = 4096


@pytest.fixture(scope="module")
def vocab(standin_tokenizer: Path) -> SimVocab:
    return load_vocab(standin_tokenizer)


def _sim_verdict(vocab: SimVocab, input_len: int, max_new_tokens: int | None, reserved: int) -> str | None:
    params = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    body = {"input_ids": [100] * input_len, "sampling_params": params}
    try:
        parse_generate_request(body, vocab, CONTEXT, reserved_tokens=reserved)
    except RequestError as error:
        return str(error)
    return None


@pytest.mark.parametrize("launch", ["plain", "eagle", "eagle-tree", "eagle3-lowercase", "standalone", "ngram"])
def test_speculative_draft_tokens_count_in_the_length_checks_as_in_sglang(
    sglang: SGLang, standin_tokenizer: Path, vocab: SimVocab, launch: str
) -> None:
    reserved = reserved_tokens(_sim_args(standin_tokenizer, LAUNCHES[launch]))
    # Each side of both limits: the input alone, and the input with max_new_tokens.
    cases = [(CONTEXT - reserved - 1, None), (CONTEXT - reserved, None), (100, CONTEXT - 100 - reserved),
             (100, CONTEXT - 100 - reserved + 1), (CONTEXT - 4, 1)]  # fmt: skip
    for input_len, max_new_tokens in cases:
        expected = sglang.call(sglang_sim_side.length_verdict, input_len, max_new_tokens, CONTEXT, reserved)
        assert _sim_verdict(vocab, input_len, max_new_tokens, reserved) == expected, (input_len, max_new_tokens)


# --- the sizes a data-parallel server reports ----------------------------------------------------------------


@pytest.mark.parametrize(("dp_size", "attn_dp_size"), [(1, 1), (2, 1), (4, 1), (8, 1), (1, 8)])
@pytest.mark.parametrize("port", [30000, 30001, 30002])
def test_a_data_parallel_server_reports_the_sizes_sglangs_controller_keeps(
    sglang: SGLang, dp_size: int, attn_dp_size: int, port: int
) -> None:
    """Replicas report ready as each finishes loading (`_record_scheduler_init_infos`), in the simulated order;
    attention-DP ranks are one TP group, whose schedulers report together."""
    key, context = f"{port}:0", 262_144
    capacities = protocol.dp_rank_capacities(context, key, dp_size, attn_dp_size)
    order = protocol.loading_order(key, dp_size)
    groups = [
        [{"max_total_num_tokens": capacity, "max_req_input_len": protocol.max_req_input_len(context, capacity)}
         for capacity in capacities[replica * attn_dp_size : (replica + 1) * attn_dp_size]]
        for replica in order
    ]  # fmt: skip
    reported = protocol.reported_capacity(capacities, order, attn_dp_size)
    expected = sglang.call(sglang_sim_side.dp_init_info, groups)
    assert expected == {
        "max_total_num_tokens": reported,
        "max_req_input_len": protocol.max_req_input_len(context, reported),
    }
    assert len(capacities) == dp_size * attn_dp_size
