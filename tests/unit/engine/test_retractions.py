"""Issue 32 item 1: SGLang retracts a running request when its KV pool runs short and re-prefills prompt + output
later (`Req.reset_for_retract`). The output is whole, but penalties and min_new_tokens start again from zero:
with them set, a retracted record was not sampled as asked; without them a retraction is harmless."""

from __future__ import annotations

import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.flags import RETRACTED
from datagen_operator.api.generation_spec import SamplingParams
from datagen_operator.api.progress import Counts
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import RETRACTIONS, CheckContext, evaluate
from datagen_operator.engine.sim.config import FaultConfig
from datagen_operator.engine.sim.faults import plan_faults
from tests.manifests import example_run

IM_END = 163586
PLAIN = rc.Expectations(thinking=False, think_start_ids=(), think_end_id=None, stop_token_ids=frozenset({IM_END}))
PENALIZED = rc.Expectations(**{**PLAIN.__dict__, "restarted_by_retraction": ("presence_penalty",)})


@pytest.mark.parametrize(
    ("sampling", "restarted"),
    [
        ({}, ()),
        ({"temperature": 0.6, "top_p": 0.95, "min_p": 0.1}, ()),
        ({"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}, ()),
        ({"frequency_penalty": 0.3}, ("frequency_penalty",)),
        ({"presence_penalty": -0.5}, ("presence_penalty",)),
        ({"repetition_penalty": 1.05}, ("repetition_penalty",)),
        ({"min_new_tokens": 8}, ("min_new_tokens",)),
    ],
)
def test_what_a_retraction_restarts(sampling: dict, restarted: tuple[str, ...]) -> None:
    params = SamplingParams(max_new_tokens=64, **sampling)
    assert params.restarted_by_retraction() == restarted
    document = example_run(**{"spec.generation.sampling": {"max_new_tokens": 64, **sampling}})
    resolved = resolve_model(parse_run(document).spec)
    assert resolved.restarted_by_retraction == restarted
    assert rc.expectations_for(resolved, None, ()).restarted_by_retraction == restarted


def test_a_retracted_record_is_flagged_only_where_the_sampling_restarts() -> None:
    ids = [1, 2, IM_END]
    finish = {"type": "stop", "matched": IM_END}
    assert rc.inspect_record([5], ids, finish, 3, False, PENALIZED, 1) == {RETRACTED}
    assert rc.inspect_record([5], ids, finish, 3, False, PENALIZED, 0) == frozenset()
    assert rc.inspect_record([5], ids, finish, 3, False, PENALIZED, None) == frozenset()  # an older server
    assert rc.inspect_record([5], ids, finish, 3, False, PLAIN, 2) == frozenset()


CTX = CheckContext(False, None, None, None, None, ChecksSpec())


def test_the_retractions_check_names_memory_and_concurrency() -> None:
    (failed,) = [c for c in evaluate(Counts(records=250, flags={RETRACTED: 9}), CTX) if c.name == RETRACTIONS]
    assert not failed.passed and failed.threshold == 0.01
    assert failed.verdict.startswith("9/250 outputs were retracted by SGLang (its KV memory ran short)")
    assert "server.memFractionStatic" in failed.verdict and "clients.concurrency" in failed.verdict
    assert "--exclude-flags retracted" in failed.verdict
    (noise,) = [c for c in evaluate(Counts(records=25, flags={RETRACTED: 1}), CTX) if c.name == RETRACTIONS]
    assert noise.passed  # checks.rates: 1 of 25 is no evidence against 1 %
    (none,) = [c for c in evaluate(Counts(records=25), CTX) if c.name == RETRACTIONS]
    assert none.passed and none.count == 0


def test_the_simulator_retracts_at_its_rate_beside_any_fault() -> None:
    always = FaultConfig(retraction_rate=1.0)
    assert all(plan_faults(always, n).retractions == 1 for n in range(50))
    assert all(plan_faults(FaultConfig(), n).retractions == 0 for n in range(50))
    half = [plan_faults(FaultConfig(retraction_rate=0.5, seed=3), n).retractions for n in range(400)]
    assert 150 < sum(half) < 250
    aborted = plan_faults(FaultConfig(retraction_rate=1.0, abort_rate=1.0), 7)
    assert aborted.abort and aborted.retractions == 1
