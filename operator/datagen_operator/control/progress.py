"""Shard progress snapshots (progress.json locally, the per-shard ConfigMaps in a cluster) summed for decide()."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from datagen_operator.checks.evaluate import Tally
from datagen_operator.control.observed import ProgressCounters

FINISHED_STATES = frozenset({"done", "complete", "completed"})
TOO_LONG = "too_long"


def snapshot_tally(s: Mapping[str, Any]) -> Tally:
    """One shard's counts, each cause apart: server 4xx (`records_rejected`), prompts set aside unsent
    (`set_aside` by cause: too long, or malformed/unrenderable), records out of attempts, answers lost to
    the output volume."""
    set_aside = s.get("set_aside")
    if set_aside:
        too_long = int(set_aside.get(TOO_LONG, 0))
        malformed = sum(map(int, set_aside.values())) - too_long
    else:  # a worker from before set_aside was published
        too_long, malformed = 0, int(s.get("prompts_malformed", 0))
    return Tally(
        records=int(s.get("records_done", 0)),
        tool_records=int(s.get("tool_records", 0)),
        rejected=int(s.get("records_rejected", 0)),
        flags={name: int(count) for name, count in (s.get("flags") or {}).items()},
        lines=int(s.get("prompts_total", 0)) + int(s.get("prompts_malformed", 0)),
        malformed=malformed,
        too_long=too_long,
        failed=int(s.get("records_failed", 0)),
        unwritten=int(s.get("records_unwritten", 0)),
    )


def snapshot_baseline(s: Mapping[str, Any], attempt_started_at: float | None = None) -> Tally:
    """What the output held when the shard's worker started (its `baseline`). A snapshot older than this
    attempt (a worker of an earlier `datagen run`) is all baseline: nothing in it is new."""
    if attempt_started_at is not None and float(s.get("started_at", 0.0)) < attempt_started_at:
        whole = snapshot_tally(s)
        return whole - Tally(lines=whole.lines)  # `lines` is a denominator, never judged away
    b = s.get("baseline") or {}
    return Tally(
        records=int(b.get("records", 0)),
        rejected=int(b.get("rejected", 0)),
        flags={name: int(count) for name, count in (b.get("flags") or {}).items()},
        malformed=int(b.get("malformed", 0)),
        too_long=int(b.get("too_long", 0)),
    )


def failure_of(snapshots: list[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when a shard stopped for a named cause (its output volume failed), with the run's
    record counts: `OutputVolumeFull`, `/out has 0 bytes free after 167/300 records; free space ...`."""
    from datagen_operator.worker.store import volume_failure_text

    failed = [s for s in snapshots if s.get("state") == "failed" and s.get("failure_reason")]
    if not failed:
        return None
    first = failed[0]
    reason = str(first["failure_reason"])
    done = sum(int(s.get("records_done", 0)) for s in snapshots)
    total = sum(int(s.get("records_total", 0)) for s in snapshots)
    if not first.get("volume_path"):
        return reason, str(first.get("message") or reason)
    free = first.get("volume_free_bytes")
    shards = sorted(int(s.get("shard", 0)) for s in failed)
    text = volume_failure_text(reason, first["volume_path"], free, done, total)
    return reason, f"{text} (shard {', '.join(map(str, shards))} stopped)"


def counters_from_snapshots(
    snapshots: Iterable[Mapping[str, Any]], *, attempt_started_at: float | None = None
) -> ProgressCounters:
    """Sum the workers' snapshots (ShardProgress as JSON); unknown keys are ignored, missing ones are 0.

    `attempt_started_at`: when this attempt began (the local runner's start); older snapshots count as
    baseline. Otherwise each worker's own `baseline` (what the disk held when it started) is used."""
    snapshots = list(snapshots)
    prompts_total = prompts_done = completion = malformed = 0
    rate = 0.0
    tally, baseline = Tally(), Tally()
    for s in snapshots:
        prompts_total += int(s.get("prompts_total", 0))
        prompts_done += int(s.get("prompts_done", 0))
        completion += int(s.get("output_tokens", 0))
        # `set_aside` counts every cause (malformed lines, unrenderable, too long); older workers only malformed.
        set_aside = s.get("set_aside")
        malformed += sum(map(int, set_aside.values())) if set_aside else int(s.get("prompts_malformed", 0))
        if s.get("state") not in FINISHED_STATES:
            rate += float(s.get("tokens_per_s", 0.0))
        tally = tally + snapshot_tally(s)
        baseline = baseline + snapshot_baseline(s, attempt_started_at)
    failure = failure_of(snapshots)
    return ProgressCounters(
        prompts_total=prompts_total,
        prompts_done=prompts_done,
        completion_tokens=completion,
        tokens_per_second=rate,
        malformed=malformed,
        tally=tally,
        baseline=baseline,
        failure_reason=failure[0] if failure else None,
        failure_message=failure[1] if failure else None,
    )
