"""k8s/object_facts.py after a resume: every shard ConfigMap's records are judged, a previous attempt's (older than the
workers Job's status.startTime) without its losses; and a worker's exit 7 names the volume failure when its
ConfigMap does not."""

from __future__ import annotations

from typing import Any

import orjson

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.k8s import object_facts as o

JOB_START = "2026-11-30T09:00:00Z"
START_S = o.parse_time(JOB_START).timestamp()  # type: ignore[union-attr]


def cm(**snapshot: Any) -> dict[str, Any]:
    return {"data": {"progress.json": orjson.dumps(snapshot).decode()}}


def job(**status: Any) -> dict[str, Any]:
    return {"spec": {"suspend": False}, "status": status}


def worker_pod(name: str, code: int, message: str | None = None, finished: str = "") -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": code, "finishedAt": finished}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": [{"name": "worker", "state": {"terminated": terminated}}]},
    }


# Shard 0 failed in the previous attempt (it lost 2 answers to the volume) and has not started again (its
# snapshot predates the Job's start); shard 1 is this attempt's worker, which resumed on 40 records.
OLD = cm(shard=0, shard_count=2, started_at=START_S - 3600, state="failed", prompts_total=50, records_done=30,
         records_rejected=4, records_unwritten=2, set_aside={"malformed": 2, "too_long": 1},
         flags={"empty": 3})  # fmt: skip
NEW = cm(shard=1, shard_count=2, started_at=START_S + 5, state="running", prompts_total=50, records_done=45,
         records_rejected=1, flags={"empty": 1})  # fmt: skip


def test_the_whole_output_is_judged_but_a_previous_attempts_losses_are_not_this_ones() -> None:
    counters = o.progress_counters([OLD, NEW], job(startTime=JOB_START, active=2))
    assert counters is not None
    counts = counters.counts
    assert (counts.records, counts.refused, counts.unusable, counts.too_long) == (75, 5, 2, 1)
    assert counts.flags.get("empty", 0) == 4 and counts.lines == 100
    assert counts.unwritten == 0  # shard 0's lost answers were the previous attempt's


def test_without_a_job_start_every_snapshot_is_this_attempts() -> None:
    for workers_job in (None, job(active=2)):  # no Job yet, or one whose controller has not set startTime
        counters = o.progress_counters([OLD, NEW], workers_job)
        assert counters is not None
        assert (counters.counts.records, counters.counts.unwritten) == (75, 2)
    assert o.job_started_at(job(startTime=JOB_START)) == START_S
    assert o.job_started_at(None) is None and o.job_started_at({}) is None


def verdict(reason: str, message: str) -> str:
    """What a failing worker writes to its termination log (worker/failure.py)."""
    return StepOutcome(False, reason, message).for_storage().decode()


def test_a_workers_named_cause_reaches_the_run_in_its_own_words() -> None:
    failed = job(startTime=JOB_START, failedIndexes="1")
    words = "spec.dataset.path /data/p.jsonl changed since this output was started: line 2 (id 'q1') edited. Restore it"
    observed = o.workers_observation(
        failed, [worker_pod("w-0", 0), worker_pod("w-1", 2, verdict("DatasetChanged", words))], 2
    )
    assert observed is not None and observed.shards_failed == 1
    assert (observed.failure_reason, observed.failure_message) == ("DatasetChanged", words)
    # The last worker to fail speaks: a cause retried earlier (no server, then the pod crashed) is not it.
    unreachable = worker_pod("w-0", 4, verdict("ServerUnreachable", "no server"), finished="2026-11-30T09:00:00Z")
    crashed = worker_pod("w-0b", 1, "Traceback ...\nMemoryError", finished="2026-11-30T09:05:00Z")
    observed = o.workers_observation(failed, [crashed, unreachable], 2)
    assert observed is not None and observed.failure_reason is None
    assert (observed.failure_message or "").endswith("w-0b exit 1: MemoryError"), observed.failure_message
    # A long cause is kept whole up to the verdict's limit, never cut from its front.
    long = "the dataset changed: " + ", ".join(f"line {i} (id 'q{i}') edited" for i in range(200))
    observed = o.workers_observation(failed, [worker_pod("w-1", 2, verdict("DatasetChanged", long))], 2)
    assert observed is not None and (observed.failure_message or "").startswith("the dataset changed: line 0 ")


def test_exit_7_names_the_volume_when_the_configmap_does_not() -> None:
    failed = job(startTime=JOB_START, failedIndexes="1")
    message = "/mnt/datagen/output is read-only after 3/10 records; mount the volume writable"
    observed = o.workers_observation(failed, [worker_pod("w-1", 7, verdict("OutputVolumeReadOnly", message))], 2)
    assert observed is not None and observed.shards_failed == 1
    assert (observed.failure_reason, observed.failure_message) == ("OutputVolumeReadOnly", message)
    # A message lost or cut short (the log sat on the full volume) still names the volume.
    for pod in (worker_pod("w-1", 7), worker_pod("w-1", 7, "Traceback (most recent call")):
        observed = o.workers_observation(failed, [pod], 2)
        assert observed is not None and observed.failure_reason == "OutputVolumeFull"
    # The ConfigMap's own reason (read from progress) is untouched, and has no failure here.
    counters = o.progress_counters([NEW], failed)
    assert counters is not None and counters.failure_reason is None


def test_a_crash_shows_its_last_words_not_a_json_log_line_or_a_tail_cut_from_the_front() -> None:
    failed = job(failedIndexes="0")
    # FallbackToLogsOnError: the kubelet's tail of the JSON log, its first line cut.
    log = "\n".join(
        [
            'ng","fingerprint_sha256":"ed17","records_done":5968}',
            orjson.dumps({"ts": 1.0, "level": "info", "logger": "datagen.worker", "msg": "dataset read"}).decode(),
            orjson.dumps(
                {"ts": 2.0, "level": "error", "logger": "datagen.worker", "msg": "boom: disk said no"}
            ).decode(),
        ]
    )
    observed = o.workers_observation(failed, [worker_pod("w-0", 1, log)], 2)
    assert observed is not None and observed.failure_reason is None
    message = observed.failure_message or ""
    assert message.endswith("w-0 exit 1: boom: disk said no") and "{" not in message, message
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: ' + "why " * 300
    observed = o.workers_observation(failed, [worker_pod("w-0", 1, traceback)], 2)
    message = (observed.failure_message if observed else None) or ""
    assert "w-0 exit 1: ValueError: why why" in message and "more characters]" in message, message


def test_other_exits_name_no_cause() -> None:
    failed = job(failedIndexes="0")
    observed = o.workers_observation(failed, [worker_pod("w-0", 2, "dataset: no such file")], 2)
    assert observed is not None and observed.failure_reason is None
    running = o.workers_observation(job(active=1), [worker_pod("w-0", 7, verdict("OutputVolumeFull", "x"))], 2)
    assert running is not None and running.failure_reason is None  # no failed index yet: nothing to name
