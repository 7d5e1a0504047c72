"""api.outcome: a step's verdict crosses processes as JSON that always fits a termination message."""

from __future__ import annotations

import orjson
import pytest

from datagen_operator.api.outcome import TERMINATION_MESSAGE_LIMIT, StepOutcome
from datagen_operator.api.status import CheckResult


def check(name: str, passed: bool, verdict: str) -> CheckResult:
    return CheckResult(name=name, passed=passed, rate=0.25, threshold=0.02, count=3, total=12, verdict=verdict)


def test_a_short_verdict_round_trips_whole() -> None:
    outcome = StepOutcome(False, "Failed", "2/8 outputs never close </think>", (check("think_end", False, "why"),))
    assert StepOutcome.from_storage(outcome.for_storage()) == outcome


@pytest.mark.parametrize("text", ["x" * 60_000, "é ✓ 思考 " * 9_000])
def test_a_huge_verdict_is_valid_json_within_the_limit_and_keeps_the_verdict(text: str) -> None:
    checks = tuple(check(f"check_{i}", passed=i % 3 != 0, verdict=f"{i}: {text}") for i in range(40))
    outcome = StepOutcome(False, "Failed", text, checks)
    assert len(orjson.dumps({"message": text})) > TERMINATION_MESSAGE_LIMIT  # the cutting path is taken

    data = outcome.for_storage()

    assert len(data) <= TERMINATION_MESSAGE_LIMIT
    back = StepOutcome.from_storage(data)  # raises on invalid JSON (the old byte cut gave JSONDecodeError)
    assert (back.passed, back.reason) == (outcome.passed, outcome.reason)
    assert back.message.startswith(text[:32]) and "more characters]" in back.message
    failed = [c for c in outcome.checks if not c.passed]
    kept = list(back.checks)
    assert kept, "at least the first failed checks survive"
    for got, want in zip(kept, failed, strict=False):
        assert (got.name, got.passed, got.rate, got.threshold, got.count, got.total) == (
            want.name, want.passed, want.rate, want.threshold, want.count, want.total
        )  # fmt: skip
    assert orjson.loads(data).get("checksOmitted", 0) == len(outcome.checks) - len(kept)


def test_passed_checks_are_kept_when_cutting_the_words_is_enough() -> None:
    checks = tuple(check(f"check_{i}", passed=True, verdict="v" * 2000) for i in range(6))
    outcome = StepOutcome(True, "Passed", "all good " * 500, checks)

    back = StepOutcome.from_storage(outcome.for_storage())

    assert [c.name for c in back.checks] == [c.name for c in checks]
    assert back.passed and back.reason == "Passed"


def test_more_failed_checks_than_fit_keep_the_first_and_say_how_many_were_left_out() -> None:
    checks = tuple(check(f"a_rather_long_check_name_{i:04d}", passed=False, verdict="") for i in range(400))
    outcome = StepOutcome(False, "Failed", "many", checks)

    data = outcome.for_storage()

    assert len(data) <= TERMINATION_MESSAGE_LIMIT
    back = StepOutcome.from_storage(data)
    assert [c.name for c in back.checks] == [c.name for c in checks[: len(back.checks)]]
    assert orjson.loads(data)["checksOmitted"] == 400 - len(back.checks) > 0
