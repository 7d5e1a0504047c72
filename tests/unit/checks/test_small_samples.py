"""Issue 32 item 7: a rate from a handful of records is noise. Every stage judges it by checks.rates: the rolling
checks (decide), the canary, the evaluation verify and the preflight share (tests/checks/test_verify.py holds
those two on a stored output). 1 truncated answer of 25 no longer halts; clear evidence and a 100 % failure do."""

from __future__ import annotations

import pytest

from datagen_operator.api.flags import NO_THINK_END, TOKEN_COUNT_MISMATCH, TRUNCATED
from datagen_operator.api.progress import Counts
from datagen_operator.checks.canary_judgment import CanaryRecord, judge_canary
from datagen_operator.checks.evaluate import REASONING_CAPTURED, TRUNCATION, evaluate, measured
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from tests.unit.decide_world import conditions, context, running, spec

CTX = context(spec())


def truncation(records: int, truncated: int):
    return next(c for c in evaluate(Counts(records=records, flags={TRUNCATED: truncated}), CTX) if c.name == TRUNCATION)


@pytest.mark.parametrize(
    ("records", "truncated", "passed"),
    [(25, 1, True), (25, 3, False), (250, 9, True), (250, 10, False), (25_000, 525, True), (25_000, 538, False)],
)
def test_the_rolling_checks_halt_only_on_clear_evidence(records: int, truncated: int, passed: bool) -> None:
    s = spec()
    d = decide(s, running(Counts(records=records, flags={TRUNCATED: truncated})), context(s))
    if passed:
        assert d.step is Step.RUN_WORKERS and conditions(d)["DataFaithful"] == ("True", "WithinThresholds")
    else:
        assert d.step is Step.HALTED and conditions(d)["DataFaithful"] == ("False", "ThresholdCrossed")
        (message,) = [u.message for u in d.updates if u.type == "DataFaithful"]
        assert f"{truncated}/{records} outputs hit max_new_tokens" in message and "above the 2% limit" in message


def test_the_issue_run_says_why_it_goes_on() -> None:
    check = truncation(25, 1)
    assert check.passed and check.verdict == (
        "1/25 outputs hit max_new_tokens (4%; from 25 outputs that is consistent with the 2% limit: the true rate "
        "may be as low as 0.205% at 95% confidence)"
    )
    assert check.rate == 0.04 and check.threshold == 0.02 and check.bound == pytest.approx(0.00205, abs=1e-5)


def test_a_clear_halt_says_the_rate_the_bound_and_the_fix() -> None:
    check = truncation(25, 3)
    assert not check.passed and check.verdict == (
        "3/25 outputs hit max_new_tokens (12%; from 25 outputs the true rate is at least 3.35% at "
        "95% confidence, above the 2% limit): raise generation.sampling.max_new_tokens"
    )
    assert measured(check) == "truncation 3/25 = 12.0%, threshold 2.0%, 95% bound 3.4%"


def test_at_25000_records_the_verdict_is_the_plain_rate_within_a_fraction_of_a_point() -> None:
    passed, failed = truncation(25_000, 537), truncation(25_000, 538)  # 2.148 % and 2.152 %
    assert passed.passed and not failed.passed
    assert failed.bound is not None and 0.02 < failed.bound < failed.rate - 0.0014


@pytest.mark.parametrize("records", [16, 25, 250, 25_000])
def test_every_output_without_reasoning_halts_at_once(records: int) -> None:
    s = spec()
    d = decide(s, running(Counts(records=records, flags={NO_THINK_END: records})), context(s))
    assert d.step is Step.HALTED
    check = next(c for c in d.checks if c.name == REASONING_CAPTURED)
    assert f"none of the {records} outputs, against a 98% minimum" in check.verdict


def record(flags: tuple[str, ...] = ()) -> CanaryRecord:
    output = [1, 163607, 2, 163586]
    return CanaryRecord("p", [163606], output, {"type": "stop"}, len(output), False, frozenset(flags))


def test_the_canary_judges_truncation_by_the_same_rule() -> None:
    # 11 canary records (3 probes, 8 prompts) at the run's own max_new_tokens: one cut answer is no evidence.
    one = judge_canary([record((TRUNCATED,)), *[record() for _ in range(10)]], CTX, capped=False)
    assert one.passed, one.message
    three = judge_canary([record((TRUNCATED,)) for _ in range(3)] + [record() for _ in range(8)], CTX, False)
    assert not three.passed and "3/11 outputs hit max_new_tokens" in three.message
    # Its strict checks stay strict: a limit of 0 fails on any one record.
    mismatch = judge_canary([record((TOKEN_COUNT_MISMATCH,)), *[record() for _ in range(10)]], CTX, False)
    assert not mismatch.passed and "any one fails" in mismatch.message
