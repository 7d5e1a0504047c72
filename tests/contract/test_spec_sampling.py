"""The spec's `generation.sampling` accepts exactly what SGLang's own `SamplingParams.verify` accepts.

A value the spec admits but SGLang refuses would fail every request of a run, hours after it was accepted.
Each corpus entry is judged by our spec model and by SGLang (construction, normalize, verify).
"""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from datagen_operator.api.generation_spec import SamplingParams as SpecSampling
from tests.contract import sglang_side
from tests.contract.conftest import SGLang
from tests.contract.sglang_side import VOCAB_SIZE

# Every entry carries max_new_tokens (the spec requires it); each varies one spec key around SGLang's bounds.
CORPUS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "temperature-zero": {"temperature": 0.0},
    "temperature-negative": {"temperature": -0.1},
    "temperature-infinite": {"temperature": float("inf")},
    "top-p-zero": {"top_p": 0.0},
    "top-p-one": {"top_p": 1.0},
    "top-p-above-one": {"top_p": 1.01},
    "top-k-minus-one": {"top_k": -1},
    "top-k-zero": {"top_k": 0},
    "top-k-zero-greedy": {"top_k": 0, "temperature": 0.0},
    "top-k-one": {"top_k": 1},
    "top-k-minus-two": {"top_k": -2},
    "min-p-zero": {"min_p": 0.0},
    "min-p-one": {"min_p": 1.0},
    "min-p-above-one": {"min_p": 1.5},
    "min-new-tokens-equal": {"min_new_tokens": 16},
    "min-new-tokens-above": {"min_new_tokens": 17},
    "min-new-tokens-negative": {"min_new_tokens": -1},
    "frequency-penalty-low-edge": {"frequency_penalty": -2.0},
    "frequency-penalty-below": {"frequency_penalty": -2.01},
    "presence-penalty-high-edge": {"presence_penalty": 2.0},
    "presence-penalty-above": {"presence_penalty": 2.5},
    "repetition-penalty-two": {"repetition_penalty": 2.0},
    "repetition-penalty-above-two": {"repetition_penalty": 2.5},
    "repetition-penalty-zero": {"repetition_penalty": 0.0},
    "repetition-penalty-small": {"repetition_penalty": 0.01},
    "stop-token-ids": {"stop_token_ids": [1, 2]},
    "sampling-seed-max": {"sampling_seed": 2**63 - 1},
    "sampling-seed-over": {"sampling_seed": 2**63},
    "sampling-seed-min": {"sampling_seed": -(2**63)},
}
MAX_NEW_TOKENS = 16


def _spec_accepts(params: dict[str, Any]) -> bool:
    try:
        SpecSampling.model_validate(params)
    except pydantic.ValidationError:
        return False
    return True


@pytest.mark.parametrize("label", list(CORPUS))
def test_spec_sampling_accepts_what_sglang_verify_accepts(sglang: SGLang, label: str) -> None:
    params = {"max_new_tokens": MAX_NEW_TOKENS, **CORPUS[label]}
    refusal = sglang.call(sglang_side.sampling_verdict, params, VOCAB_SIZE)
    assert _spec_accepts(params) == (refusal is None), refusal


def test_max_new_tokens_zero_is_the_one_deliberate_difference(sglang: SGLang) -> None:
    # SGLang accepts a zero budget; a run that makes no tokens is refused by the spec.
    assert sglang.call(sglang_side.sampling_verdict, {"max_new_tokens": 0}, VOCAB_SIZE) is None
    assert not _spec_accepts({"max_new_tokens": 0})
