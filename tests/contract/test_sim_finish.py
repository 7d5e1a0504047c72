"""Where the simulator ends an output, and with which finish_reason, against SGLang's own per-token finish
checks (`Req.update_finish_state`, pinned wheel) on the same tokens: stop strings before stop tokens before
the length cap, so a stop on the max_new_tokens-th token is a stop, and of two stop strings one token
completes, the first listed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.engine.model_configs import read_model_eos_ids
from datagen_operator.engine.sim.config import ModelConfig
from datagen_operator.engine.sim.model import ThinkingMode, finish_output, natural_output
from datagen_operator.engine.sim.sampling import parse_sampling_params
from datagen_operator.engine.sim.vocab import SimVocab, load_vocab
from tests.contract import sglang_sim_side
from tests.contract.conftest import SGLang

CONFIG = ModelConfig(mean_answer_tokens=40, mean_reasoning_tokens=40, length_sigma=0)


@pytest.fixture(scope="module")
def vocab(standin_tokenizer: Path) -> SimVocab:
    return load_vocab(standin_tokenizer)


@pytest.fixture(scope="module")
def output_ids(vocab: SimVocab) -> list[int]:
    """A whole answer, reasoning and all, ending with the model's stop token."""
    ids = natural_output(random.Random(7), ThinkingMode.UNPROMPTED, (), CONFIG, vocab).ids()
    assert ids[-1] in vocab.eos_ids
    return ids


def _first_at(ids: list[int], vocab: SimVocab) -> tuple[int, str, str]:
    """A token whose id, whose text and whose text's last two characters all first occur with it: the case
    where a stop string and a stop id (or two stop strings) land on one token."""
    for index in range(len(ids) - 10, 0, -1):
        text = vocab.decode([ids[index]])
        before = vocab.decode(ids[:index])
        suffix = text.strip()[-2:]
        if len(text.strip()) >= 3 and ids.index(ids[index]) == index and suffix not in before + text[: -len(suffix)]:
            return index, text, suffix
    raise AssertionError("no such token in the output")


def _cases(ids: list[int], vocab: SimVocab) -> dict[str, dict[str, Any]]:
    """Sampling params by case; `max_new_tokens` is already what the scheduler would let the request run to."""
    last = len(ids)
    word, text, suffix = _first_at(ids, vocab)
    return {
        "eos-is-the-last-allowed-token": {"max_new_tokens": last},
        "eos-one-past-the-cap": {"max_new_tokens": last - 1},
        "eos-well-inside-the-cap": {"max_new_tokens": last + 5},
        "ignore-eos": {"max_new_tokens": last, "ignore_eos": True},
        "request-stop-id-is-the-last-allowed-token": {"max_new_tokens": word + 1, "stop_token_ids": [ids[word]]},
        "request-stop-id-one-past-the-cap": {"max_new_tokens": word, "stop_token_ids": [ids[word]]},
        "stop-string-done-by-the-last-allowed-token": {"max_new_tokens": word + 1, "stop": [text]},
        "stop-string-and-stop-id-on-one-token": {"max_new_tokens": last, "stop": [text], "stop_token_ids": [ids[word]]},
        "two-stop-strings-on-one-token": {"max_new_tokens": last, "stop": [text, suffix]},
        "two-stop-strings-reversed": {"max_new_tokens": last, "stop": [suffix, text]},
    }


def test_the_simulator_finishes_where_sglang_does(
    sglang: SGLang, standin_tokenizer: Path, vocab: SimVocab, output_ids: list[int]
) -> None:
    natural = vocab.run(output_ids)
    for name, raw in _cases(output_ids, vocab).items():
        sim = finish_output(natural, parse_sampling_params(raw), vocab, raw["max_new_tokens"])
        expected = sglang.call(
            sglang_sim_side.finish_state,
            model_dir=str(standin_tokenizer),
            output_ids=output_ids,
            sampling_params=raw,
            eos_token_ids=sorted(vocab.eos_ids),
            vocab_size=vocab.size,
        )
        expected.pop("output_ids", None)
        assert {"finish_reason": sim.finish_reason, "finished_len": len(sim.run)} == expected, name


def test_a_sample_outside_the_vocabulary_ends_as_sglangs_nan_guard_ends_it(
    sglang: SGLang, standin_tokenizer: Path, vocab: SimVocab, output_ids: list[int]
) -> None:
    """NaN logits make the sampler return an id outside the vocabulary; SGLang's `_check_vocab_boundary_finish`
    writes a stop id over it and reports `matched: "NaN happened"`. The simulator's fault gives the same ids and
    finish_reason, and the record checks flag that record (`nan_replaced`), its stop id notwithstanding."""
    from datagen_operator.api import parse_spec
    from datagen_operator.api.flags import NAN_REPLACED
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.checks import record_checks as rc
    from datagen_operator.engine.sim.model import nan_guarded
    from datagen_operator.prompts.render import load_tokenizer
    from tests.manifests import local_spec

    raw = {"max_new_tokens": len(output_ids) + 5}
    completed = finish_output(vocab.run(output_ids), parse_sampling_params(raw), vocab, raw["max_new_tokens"])
    sim = nan_guarded(completed, frozenset(), vocab)
    keep = len(completed.run) // 2
    sampled = [*output_ids[:keep], vocab.size, *output_ids[keep + 1 :]]  # the bad id, then what would follow
    expected = sglang.call(
        sglang_sim_side.finish_state,
        model_dir=str(standin_tokenizer),
        output_ids=sampled,
        sampling_params=raw,
        eos_token_ids=sorted(vocab.eos_ids),
        vocab_size=vocab.size,
    )
    assert expected["finish_reason"] == {"type": "stop", "matched": "NaN happened"}
    assert {"finish_reason": sim.finish_reason, "output_ids": sim.run.ids()} == {
        "finish_reason": expected["finish_reason"],
        "output_ids": expected["output_ids"],
    }
    spec = parse_spec(local_spec(standin_tokenizer, Path("/nonexistent"), Path("/nonexistent")))
    tokenizer = load_tokenizer(standin_tokenizer, trust_remote_code=False)
    expect = rc.expectations_for(resolve_model(spec), tokenizer, read_model_eos_ids(standin_tokenizer))
    flags = rc.inspect_record([1, 2, 3], expected["output_ids"], expected["finish_reason"], keep + 1, False, expect)
    assert NAN_REPLACED in flags


@pytest.mark.parametrize(
    ("input_len", "max_new_tokens"),
    [(1000, 64), (262_144 - 64, 64), (262_144 - 65, 64), (262_144 - 66, 64), (262_144 - 10, None), (100, None)],
)
def test_the_scheduler_caps_max_new_tokens_where_sglangs_does(
    sglang: SGLang, vocab: SimVocab, input_len: int, max_new_tokens: int | None
) -> None:
    """The scheduler keeps two tokens of the context free (`max_req_len - input_len - 1`, `max_req_len` the context
    less one): a request the tokenizer manager admits with prompt + max_new_tokens at the context ends
    `length` two tokens short."""
    from datagen_operator.engine.sim.protocol import parse_generate_request

    context = 262_144  # the stand-in's max_position_embeddings
    params = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    request = parse_generate_request({"input_ids": [100] * input_len, "sampling_params": params}, vocab, context)
    expected = sglang.call(sglang_sim_side.scheduler_max_new_tokens, input_len, params, context)
    assert request.items[0].max_new_tokens == expected
