"""What a run's own status remembers, read back as observations: step verdicts kept in their conditions, and a
halt that stands until the spec changes. Pure functions of the status; an operator restart loses nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import SHARD_CAUSES, Reason
from datagen_operator.api.status import (
    CANARY_PASSED,
    DATA_FAITHFUL,
    INPUTS_VERIFIED,
    SUCCEEDED,
    CheckResult,
    Condition,
    DataGenRunStatus,
    Phase,
    Progress,
)
from datagen_operator.control.observed import HaltedBefore, WorkersObservation

LEGACY_HALT_REASONS = frozenset(
    {
        Reason.PREFLIGHT_FAILED,
        Reason.SERVER_FAILED,
        Reason.PARSERS_MISMATCH,
        Reason.PROBE_FAILED,
        Reason.CANARY_FAILED,
        Reason.CHECKS_FAILED,
        Reason.WORKERS_FAILED,
    }
    | SHARD_CAUSES
)
"""Succeeded=False reasons of the halts of operators before status.halted: how a status they wrote is read
after an upgrade, so a run they halted does not ask for its server again."""

FINAL_FAITHFUL_REASONS = frozenset({Reason.VERIFIED, Reason.CHECKS_FAILED})
"""DataFaithful reasons that only the final verification sets (rolling checks use others)."""


def remembered_outcome(
    conditions: Sequence[Condition], type_: str, data_generation: int, checks: Sequence[CheckResult] = ()
) -> StepOutcome | None:
    """A step outcome kept in the condition itself: True/False recorded at or after the generation whose
    data-affecting spec is applied. This is how an operator restart avoids re-running a step."""
    for condition in conditions:
        if condition.type != type_ or condition.status == "Unknown":
            continue
        if (condition.observed_generation or 0) < data_generation:
            return None
        return StepOutcome(condition.status == "True", condition.reason, condition.message, tuple(checks))
    return None


def remembered_preflight(status: DataGenRunStatus, data_generation: int) -> StepOutcome | None:
    """The preflight's verdict from InputsVerified, with the dataset's prompt count it gave (kept in
    status.progress): the run's total stands once the preflight's pod is gone. What the status last showed done
    stands as `recorded`: the records stay in the output, so a resume whose workers have not counted them yet
    (their ConfigMaps new) shows no fewer."""
    outcome = remembered_outcome(status.conditions, INPUTS_VERIFIED, data_generation, status.checks)
    if outcome is None or status.progress is None:
        return outcome
    progress = status.progress
    recorded = progress.records_done if progress.dataset_prompts is not None else None
    return replace(outcome, prompts=progress.dataset_prompts, turns=progress.dataset_turns, recorded=recorded)


def remembered_canary(status: DataGenRunStatus, data_generation: int) -> StepOutcome | None:
    """The canary's verdict from CanaryPassed, with the number it resolved for clients.concurrency auto (kept in
    status.concurrency): a workers' Job made again sends at the same number."""
    outcome = remembered_outcome(status.conditions, CANARY_PASSED, data_generation, status.checks)
    return replace(outcome, concurrency=status.concurrency) if outcome is not None else None


def canary_in_force(
    remembered: StepOutcome | None, from_job: StepOutcome | None, *, resumed_before_workers: bool
) -> StepOutcome | None:
    """The canary verdict a pass goes by: the status's (its pod may be gone), else its Job's. A run resumed before
    any worker started goes by its Job alone, which its suspension deleted: the canary is asked again, and the
    canary program reuses a pass kept in the output only for the same spec, tokenizer files and chat template
    (api/canary_reuse.py), the rule `datagen run` follows, since the operator reads no files."""
    return from_job if resumed_before_workers else (remembered or from_job)


def remembered_final(
    conditions: Sequence[Condition], data_generation: int, checks: Sequence[CheckResult]
) -> StepOutcome | None:
    """The final verification's verdict, from DataFaithful (and Succeeded's reason when it failed)."""
    faithful = next((c for c in conditions if c.type == DATA_FAITHFUL), None)
    succeeded = next((c for c in conditions if c.type == SUCCEEDED), None)
    if faithful is None or faithful.reason not in FINAL_FAITHFUL_REASONS:
        return None
    if (faithful.observed_generation or 0) < data_generation:
        return None
    passed = faithful.status == "True"
    reason = Reason.VERIFIED if passed else (succeeded.reason if succeeded else Reason.VERIFICATION_FAILED)
    return StepOutcome(passed, reason, faithful.message, tuple(checks))


def remembered_halt(status: DataGenRunStatus, changed_generation: int) -> HaltedBefore | None:
    """A halt decided at or after the spec's last change (status.halted, Succeeded=False;
    `changed_generation`: k8s.children.SpecInForce's, which suspend and resume do not move): it stands until
    the spec changes, so a pass over a halted run never asks for the server again, suspended, resumed or after
    an operator restart."""
    succeeded = next((c for c in status.conditions if c.type == SUCCEEDED), None)
    if succeeded is None or succeeded.status != "False":
        return None
    halted = status.halted if status.halted is not None else succeeded.reason in LEGACY_HALT_REASONS
    if not halted:
        return None
    if (succeeded.observed_generation or 0) < changed_generation:
        return None
    inputs = next((c for c in status.conditions if c.type == INPUTS_VERIFIED), None)
    canary = next((c for c in status.conditions if c.type == CANARY_PASSED), None)
    return HaltedBefore(
        reason=succeeded.reason,
        failed=status.phase == Phase.FAILED,
        checks=tuple(status.checks),
        progress=status.progress,
        lease_kept=inputs is not None and inputs.status == "True" and not (canary and canary.status == "False"),
        at=_seconds_after(succeeded.last_transition_time),
    )


def _seconds_after(timestamp: str) -> float | None:
    """A condition's time as seconds since the epoch, at the end of its second (conditions keep whole seconds:
    what happened in that second happened before it)."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() + 1.0
    except ValueError:
        return None


def remembered_workers(progress: Progress | None, shards: int) -> WorkersObservation | None:
    """Every shard done, as the status last reported it: what the workers' Job said once it is gone (deleted by
    a user, or by its TTL) before the final verdict is recorded. Shards are frozen once bulk work starts, so a
    count reported for the run's shards stays true."""
    if progress is None or shards < 1 or progress.shards_total != shards or progress.shards_done < shards:
        return None
    return WorkersObservation(shards_total=shards, shards_done=shards)
