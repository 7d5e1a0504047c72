"""Shard progress snapshots (progress.json locally, the per-shard ConfigMaps in a cluster) summed for decide()."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from datagen_operator.api.duration import format_duration
from datagen_operator.api.progress import Counts, ShardProgress, sum_counts
from datagen_operator.api.status import Progress
from datagen_operator.control.conditions import rfc3339
from datagen_operator.control.observed import ProgressCounters


def eta_seconds(start: tuple[float, int], now: tuple[float, int], total: int) -> int | None:
    """Seconds left at the rate records were done since `start` ((seconds, records done) when the workers began
    to be counted generating), from `now`; None before any was done since, or once all are: the one ETA rule of
    `datagen run`'s log and the operator's status.progress.eta."""
    (t0, done0), (t1, done1) = start, now
    if done1 <= done0 or t1 <= t0 or done1 >= total:
        return None
    return round((total - done1) * (t1 - t0) / (done1 - done0))


def with_eta(progress: Progress, seconds: int | None, now: datetime) -> Progress:
    """The progress with its ETA (`eta`, `etaAt`, and in the summary `kubectl get dgr` shows); as it is without one."""
    if seconds is None:
        return progress
    eta = format_duration(seconds)
    return progress.model_copy(
        update={
            "eta": eta,
            "eta_at": rfc3339(now + timedelta(seconds=seconds)),
            "summary": f"{progress.summary}, ETA {eta}",
        }
    )


def stale_events(s: ShardProgress, attempt_started_at: float | None) -> Counts:
    """What a snapshot older than this attempt (a worker of an earlier `datagen run`, a previous Job's
    ConfigMap) says happened then and not now: answers lost to the volume and requests out of attempts. Its
    records, flags and set-aside lines stay: the rolling checks judge the whole output."""
    if not _older(s, attempt_started_at):
        return Counts()
    return Counts(failed=s.counts.failed, unwritten=s.counts.unwritten)


def _older(s: ShardProgress, attempt_started_at: float | None) -> bool:
    return attempt_started_at is not None and s.started_at < attempt_started_at


def failure_of(snapshots: list[ShardProgress]) -> tuple[str, str] | None:
    """(reason, message) when a shard stopped for a named cause (its output volume failed), with the run's
    record counts: `OutputVolumeFull`, `/out has 0 bytes free after 167/300 records; free space ...`."""
    from datagen_operator.output.volume import volume_failure_text

    failed = [s for s in snapshots if s.state == "failed" and s.failure_reason]
    if not failed:
        return None
    first = failed[0]
    reason = first.failure_reason
    done = sum(s.records_done for s in snapshots)
    total = sum(s.records_total for s in snapshots)
    if not first.volume_path:
        return reason, first.message or reason
    shards = sorted(s.shard for s in failed)
    text = volume_failure_text(reason, first.volume_path, first.volume_free_bytes, done, total)
    return reason, f"{text} (shard {', '.join(map(str, shards))} stopped)"


def counters_from_snapshots(
    snapshots: Iterable[ShardProgress], *, attempt_started_at: float | None = None
) -> ProgressCounters:
    """Sum the workers' snapshots: their counts as they are, less what older attempts lost (`stale_events`).

    `attempt_started_at`: when this attempt began (the local runner's start, the workers Job's)."""
    snapshots = list(snapshots)
    by_turn: Counter[int] = Counter()
    flagged: Counter[int] = Counter()
    for s in snapshots:
        by_turn.update({int(turn): n for turn, n in s.records_by_turn.items()})
        flagged.update({int(turn): n for turn, n in s.flagged_by_turn.items()})
    counts = sum_counts(s.counts for s in snapshots) - sum_counts(
        stale_events(s, attempt_started_at) for s in snapshots
    )
    failure = failure_of(snapshots)
    return ProgressCounters(
        prompts_total=sum(s.prompts_total for s in snapshots),
        prompts_done=sum(s.prompts_done for s in snapshots),
        # A snapshot of an earlier attempt that never finished (its worker was killed) measured a rate nobody has.
        tokens_per_second=sum(
            s.tokens_per_s for s in snapshots if not s.finished and not _older(s, attempt_started_at)
        ),
        counts=counts,
        records_by_turn=dict(by_turn),
        flagged_by_turn=dict(flagged),
        failure_reason=failure[0] if failure else None,
        failure_message=failure[1] if failure else None,
    )
