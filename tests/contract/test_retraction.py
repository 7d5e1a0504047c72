"""A retraction restarts exactly the sampling state SGLang 0.5.23 builds over the output: the spec's
`SamplingParams.restarted_by_retraction` names the parameters whose penalizer SGLang's own `penaltylib` runs.
With any of them, a retracted record (meta_info.num_retractions > 0) is flagged `retracted`
(checks/record_checks.py); without them a retraction re-prefills prompt + output and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api.generation_spec import SamplingParams
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

CORPUS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "sampling-only": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05},
    "neutral-values": {
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
    },
    "frequency": {"frequency_penalty": 0.4},
    "presence-negative": {"presence_penalty": -1.0},
    "repetition-below-one": {"repetition_penalty": 0.9},
    "repetition-above-one": {"repetition_penalty": 1.1},
    "min-new-tokens": {"min_new_tokens": 8},
    "all": {"frequency_penalty": 0.1, "presence_penalty": 0.1, "repetition_penalty": 1.2, "min_new_tokens": 1},
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_parameters_a_retraction_restarts_are_sglangs_penalizers(sglang: SGLang, name: str) -> None:
    params = {"max_new_tokens": 16, **CORPUS[name]}
    ours = SamplingParams.model_validate(params).restarted_by_retraction()
    assert list(ours) == sglang.call(sglang_side.penalizers_required, params), name


def test_a_retraction_is_counted_and_keeps_the_output(sglang: SGLang) -> None:
    """What the simulator's `--sim-retraction-rate` reports (tests/sim/test_retractions.py): the count in
    meta_info.num_retractions and the whole answer, the output kept for the re-prefill."""
    assert sglang.call(sglang_side.retract, [5, 6, 7], 2) == {"retraction_count": 2, "output_ids": [5, 6, 7]}
