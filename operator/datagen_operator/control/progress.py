"""The run's progress for decide(): shard snapshots (progress.json locally, the per-shard ConfigMaps in a cluster)
summed, and the Progress text the status shows (`kubectl get dgr`'s column, the local display)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial

from datagen_operator.api.duration import format_duration
from datagen_operator.api.progress import Counts, ShardProgress, sum_counts
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import Progress
from datagen_operator.control.conditions import rfc3339
from datagen_operator.control.observed import Observed, ProgressCounters


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


def human_rate(tokens_per_second: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_second >= scale:
            return f"{tokens_per_second / scale:.1f}{unit}"
    return f"{tokens_per_second:.0f}"


def progress_of(
    counters: ProgressCounters | None,
    shards_total: int,
    shards_done: int,
    *,
    dataset_prompts: int | None = None,
    dataset_turns: int | None = None,
    recorded: int | None = None,
    samples: int = 1,
    uncounted: str = "workers starting",
    rate: bool = True,
) -> Progress:
    """The run's progress over its whole output; `uncounted` is the summary while no total is known, `rate`
    False for a run that stops now (halted, suspended): the last rate is no longer anyone's.

    The total is the preflight's count of the dataset (`dataset_prompts`) from the start: the workers' sum
    grows as they read the dataset, so it stands in only where no preflight counted. Done is counted in
    samples over the whole output (recorded, refused by the server, set aside), which a resumed worker reads
    from disk before it reads the dataset again: it never goes backwards. The workers' per-prompt count starts
    over on a resume, so it is shown only where no preflight counted. Whole conversations (`dataset_turns`, the
    preflight's count of their planned turns) are counted in turns, their conversations beside them. `recorded`:
    the records the preflight found in the output, done before any worker of this attempt has counted them."""
    c = counters or ProgressCounters()
    counts = c.counts
    settled = counts.records + counts.refused + counts.records_set_aside
    if dataset_prompts is None:
        prompts_total, prompts_done = c.prompts_total, c.prompts_done
        records_total, records_done = prompts_total * samples, settled
    else:
        prompts_total, records_total = dataset_prompts, (dataset_turns or dataset_prompts) * samples
        # A prompt set aside after some of its samples were recorded counts each once: never past the total.
        records_done = min(records_total, max(settled, recorded or 0))
        # One answer a prompt: a prompt is done when its sample is. More: the workers' count, for the status only.
        single = samples == 1 and dataset_turns is None
        prompts_done = records_done if single else min(prompts_total, c.prompts_done)
    progress = Progress(
        prompts_total=prompts_total,
        prompts_done=prompts_done,
        records_total=records_total,
        records_done=records_done,
        records=counts.records,
        dataset_prompts=dataset_prompts,
        dataset_turns=dataset_turns,
        completion_tokens=counts.output_tokens,
        tokens_per_second=round(c.tokens_per_second, 1),
        shards_total=shards_total,
        shards_done=shards_done,
        refused=counts.refused,
        set_aside=dict(counts.set_aside),
    )
    rate_shown = c.tokens_per_second if rate else None
    return progress.model_copy(update={"summary": _summary(progress, samples, counters, rate_shown, uncounted)})


def _summary(p: Progress, samples: int, counters: ProgressCounters | None, rate: float | None, uncounted: str) -> str:
    """What `kubectl get dgr` shows: '1234/88000 prompts, 5.1k tok/s, 3 refused, 2 set aside'; `rate` None for
    a run that stops now."""
    conversations = p.dataset_turns is not None
    if conversations and p.records_total:
        done, total, unit = p.records_done, p.records_total, "turns" if samples == 1 else "records"
    elif p.dataset_prompts is None or samples == 1:
        done, total, unit = p.prompts_done, p.prompts_total, "prompts"
    else:
        done, total, unit = p.records_done, p.records_total, "records"
    summary = f"{done}/{total} {unit}"
    if conversations and total:
        summary += f" ({p.prompts_done}/{p.prompts_total} conversations)"
    producing = counters is not None and done < total
    if rate is not None and (producing or rate):  # a finished run (or one not generating yet) has none
        summary += f", {human_rate(rate)} tok/s"
    if not total:
        summary = uncounted
    set_aside = sum(p.set_aside.values())
    return summary + (f", {p.refused} refused" if p.refused else "") + (f", {set_aside} set aside" if set_aside else "")


def _uncounted(observed: Observed, begun: bool) -> str:
    """The Progress column before any total is known: what the run is doing instead, never a step it is not at."""
    preflight = observed.preflight
    if observed.workers is not None:
        return "workers starting"
    if preflight is None:
        return "waiting for the workers' count" if begun else "preflight running"
    if not preflight.passed:
        return "halted at the preflight"
    return "waiting for the workers' count"  # a passed preflight whose count is not at hand


def _complete(progress: Progress) -> Progress:
    """A run over a complete output: every sample is done (what the preflight read from its manifest), whether
    or not this run's own workers ever counted them (they never ran)."""
    samples = progress.records_total // progress.prompts_total if progress.prompts_total else 1
    done, total, unit = (
        (progress.prompts_total, progress.prompts_total, "prompts")
        if samples == 1
        else (progress.records_total, progress.records_total, "records")
    )
    return progress.model_copy(
        update={
            "prompts_done": progress.prompts_total,
            "records_done": progress.records_total,
            "summary": f"{done}/{total} {unit}",
        }
    )


def run_progress(spec: DataGenRunSpec, observed: Observed, begun: bool) -> tuple[Progress, Progress]:
    """The run's progress and the progress of a run that stops now (no rate), as one pass of decide reports them:
    counted against the preflight's count when it passed; `begun`: the run got past the preflight."""
    preflight, workers = observed.preflight, observed.workers
    counted = preflight if preflight is not None and preflight.passed else None
    count = partial(
        progress_of,
        observed.progress,
        spec.clients.shards,
        workers.shards_done if workers else 0,
        dataset_prompts=counted.prompts if counted else None,
        dataset_turns=counted.turns if counted else None,
        recorded=counted.recorded if counted else None,
        samples=spec.generation.samples_per_prompt,
        uncounted=_uncounted(observed, begun),
    )
    progress, stopped_at = count(), count(rate=False)
    if counted is not None and counted.complete:
        progress = stopped_at = _complete(progress)
    return progress, stopped_at
