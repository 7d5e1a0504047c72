"""checks.canary: the verdict over a few real prompts' raw token ids, before any bulk record."""

from __future__ import annotations

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.canary import CanaryRecord, judge_canary
from datagen_operator.checks.evaluate import CheckContext

CTX = CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, ChecksSpec())


def record(flags, output=(1, 163607, 2, 163586), tools=False) -> CanaryRecord:
    return CanaryRecord("p", [163606], list(output), {"type": "stop"}, len(output), tools, frozenset(flags))


def test_canary_passes_clean_records_and_forgives_capped_truncation() -> None:
    outcome = judge_canary([record(()), record((rc.TRUNCATED,), output=(1, 2))], CTX, capped=True)
    assert outcome.passed, outcome.message


def test_canary_fails_on_any_raw_token_problem() -> None:
    outcome = judge_canary([record(()), record((rc.TOKEN_COUNT_MISMATCH,))], CTX, capped=True)
    assert not outcome.passed and "completion_tokens" in outcome.message


def test_canary_that_never_sees_a_think_end_is_inconclusive() -> None:
    outcome = judge_canary([record((rc.TRUNCATED,), output=(1, 2, 3))] * 3, CTX, capped=True)
    assert not outcome.passed and "raise generation.sampling.max_new_tokens" in outcome.message


def test_canary_verdict_survives_the_termination_message() -> None:
    outcome = judge_canary(
        [record((rc.NO_THINK_END, rc.PROMPT_CLOSES_THINK), output=(5, 163586))] * 8, CTX, capped=False
    )
    data = outcome.for_storage()
    assert len(data) <= 4096
    back = StepOutcome.from_storage(data)
    assert (back.passed, back.reason, back.message) == (outcome.passed, outcome.reason, outcome.message)


def test_thinking_control_reads_the_median_length_ratio() -> None:
    from datagen_operator.checks.canary import ThinkingControl, judge_thinking_control

    answers_only = ThinkingControl((0.8, 1.1, 1.3, 9.0))  # one unusually long answer decides nothing
    assert "ignores thinking" in judge_thinking_control(answers_only, CTX, "kimi-k2.5").verdict
    reasoning = ThinkingControl((6.5, 8.0, 0.9, 7.2))
    verdict = judge_thinking_control(reasoning, CTX, "kimi-k2.5").verdict
    assert "reasons but never closes its reasoning" in verdict and "x6.8" in verdict  # median of 6.5 and 7.2
