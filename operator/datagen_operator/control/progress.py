"""Shard progress snapshots (progress.json locally, the per-shard ConfigMaps in a cluster) summed for decide()."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from datagen_operator.api.progress import ShardProgress
from datagen_operator.checks.evaluate import Tally
from datagen_operator.control.observed import ProgressCounters
from datagen_operator.output.records import TOO_LONG


def snapshot_tally(s: ShardProgress) -> Tally:
    """One shard's counts, each cause apart: server 4xx (`records_rejected`), prompts set aside unsent
    (`set_aside` by cause: too long, or malformed/unrenderable), records out of attempts, answers lost to
    the output volume."""
    too_long = int(s.set_aside.get(TOO_LONG, 0))
    malformed = sum(map(int, s.set_aside.values())) - too_long
    return Tally.of(
        s.counts,
        rejected=s.records_rejected,
        lines=s.prompts_total + s.prompts_malformed,
        malformed=malformed,
        too_long=too_long,
        failed=s.records_failed,
        unwritten=s.records_unwritten,
    )


def stale_events(s: ShardProgress, attempt_started_at: float | None) -> Tally:
    """What a snapshot older than this attempt (a worker of an earlier `datagen run`, a previous Job's
    ConfigMap) says happened then and not now: answers lost to the volume and requests out of attempts. Its
    records, flags and set-aside lines stay: the rolling checks judge the whole output."""
    if attempt_started_at is None or s.started_at >= attempt_started_at:
        return Tally()
    return Tally(failed=s.records_failed, unwritten=s.records_unwritten)


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
    """Sum the workers' snapshots.

    `attempt_started_at`: when this attempt began (the local runner's start, the workers Job's): what older
    snapshots say was lost or failed then is not this attempt's (`stale_events`)."""
    snapshots = list(snapshots)
    prompts_total = prompts_done = set_aside = completion = malformed = 0
    rate = 0.0
    tally = Tally()
    by_turn: Counter[int] = Counter()
    flagged: Counter[int] = Counter()
    for s in snapshots:
        by_turn.update({int(turn): n for turn, n in s.records_by_turn.items()})
        flagged.update({int(turn): n for turn, n in s.flagged_by_turn.items()})
        prompts_total += s.prompts_total
        prompts_done += s.prompts_done
        set_aside += s.records_set_aside
        completion += s.output_tokens
        malformed += sum(map(int, s.set_aside.values()))  # every cause: malformed lines, unrenderable, too long
        if not s.finished:
            rate += s.tokens_per_s
        tally = tally + snapshot_tally(s) - stale_events(s, attempt_started_at)
    failure = failure_of(snapshots)
    return ProgressCounters(
        prompts_total=prompts_total,
        prompts_done=prompts_done,
        records_set_aside=set_aside,
        completion_tokens=completion,
        tokens_per_second=rate,
        malformed=malformed,
        tally=tally,
        records_by_turn=dict(by_turn),
        flagged_by_turn=dict(flagged),
        failure_reason=failure[0] if failure else None,
        failure_message=failure[1] if failure else None,
    )
