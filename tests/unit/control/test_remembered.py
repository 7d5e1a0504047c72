"""control.remembered: verdicts and halts read back from a run's own status (pure)."""

from __future__ import annotations

from datagen_operator.api.status import Condition, ConditionStatus, DataGenRunStatus, Progress
from datagen_operator.control.remembered import remembered_final, remembered_halt, remembered_outcome


def cond(type_: str, status: ConditionStatus, reason: str, generation: int) -> Condition:
    return Condition(
        type=type_, status=status, reason=reason, message="m", last_transition_time="t", observed_generation=generation
    )


def test_outcomes_remembered_in_conditions_until_the_data_spec_changes() -> None:
    conditions = [cond("ParsersVerified", "True", "Verified", 3), cond("CanaryPassed", "Unknown", "Running", 3)]
    remembered = remembered_outcome(conditions, "ParsersVerified", 2)
    assert remembered is not None and remembered.passed and remembered.reason == "Verified"
    assert remembered_outcome(conditions, "ParsersVerified", 4) is None
    assert remembered_outcome(conditions, "CanaryPassed", 1) is None
    final = [cond("DataFaithful", "True", "Verified", 5), cond("Succeeded", "True", "Completed", 5)]
    outcome = remembered_final(final, 5, [])
    assert outcome is not None and outcome.passed
    assert remembered_final([cond("DataFaithful", "True", "WithinThresholds", 5)], 5, []) is None
    failed = remembered_final(
        [cond("DataFaithful", "False", "ChecksFailed", 5), cond("Succeeded", "False", "X", 5)], 5, []
    )
    assert failed is not None and not failed.passed and failed.reason == "X"


def status(*conditions: Condition, phase: str = "Halted") -> DataGenRunStatus:
    return DataGenRunStatus(phase=phase, conditions=list(conditions), progress=Progress(summary="3/9 prompts"))


def test_a_halt_stands_until_the_spec_changes_beyond_suspend() -> None:
    halted = status(cond("Succeeded", "False", "CanaryFailed", 4))
    remembered = remembered_halt(halted, 4)
    assert remembered is not None and remembered.reason == "CanaryFailed" and not remembered.failed
    assert remembered.progress is not None and remembered.progress.summary == "3/9 prompts"
    assert remembered_halt(halted, 5) is None, "a changed spec is looked at again"
    # Suspend and resume are generations 5 and 6 whose last change beyond spec.suspend is still 4.
    assert remembered_halt(halted, 4) is not None


def test_only_halt_reasons_are_sticky() -> None:
    for reason in ("ProbeFailed", "ParsersMismatch", "OutputVolumeFull", "WorkersFailed"):
        assert remembered_halt(status(cond("Succeeded", "False", reason, 1)), 1) is not None, reason
    for condition in (
        cond("Succeeded", "False", "InvalidSpec", 1),  # decided afresh each pass
        cond("Succeeded", "False", "ExportFailed", 1),  # a finished run, not a halt
        cond("Succeeded", "Unknown", "Running", 1),
        cond("Succeeded", "True", "Completed", 1),
    ):
        assert remembered_halt(status(condition), 1) is None, condition.reason
    assert remembered_halt(status(), 1) is None


def test_a_halt_keeps_the_lease_when_the_preflight_took_it_and_no_refusing_step_gave_it_back() -> None:
    def halt(*conditions: Condition) -> bool:
        succeeded = cond("Succeeded", "False", "ParsersMismatch", 1).model_copy(
            update={"last_transition_time": "2026-12-03T16:00:00Z"}
        )
        remembered = remembered_halt(status(*conditions, succeeded), 1)
        assert remembered is not None and remembered.at == 1796313601.0, "the end of the halt's second"
        return remembered.lease_kept

    passed = cond("InputsVerified", "True", "Passed", 1)
    assert halt(passed) and halt(passed, cond("CanaryPassed", "Unknown", "Waiting", 1))
    assert not halt(passed, cond("CanaryPassed", "False", "CanaryFailed", 1)), "the canary's refusal gave it back"
    assert not halt(cond("InputsVerified", "False", "OutputInUse", 1)), "the preflight never took it"
    assert not halt()
