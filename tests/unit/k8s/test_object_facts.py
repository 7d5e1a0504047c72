"""k8s.object_facts: API objects mapped to what decide() reads (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.k8s import object_facts as o

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"controller-revision-hash": "r1"}}, "status": status}


STS = {"metadata": {"name": "kimi-server"}, "status": {"updateRevision": "r1"}}


def test_unschedulable_pod_carries_the_scheduler_message() -> None:
    p = pod(
        "kimi-server-0",
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ],
    )
    observed = o.server_observation([p], STS, 1, ["http://x"], {}, NOW)
    (instance,) = observed.instances
    assert not instance.scheduled and "Insufficient nvidia.com/gpu" in (instance.unschedulable_message or "")


def test_ready_needs_the_kubelet_and_the_server_itself() -> None:
    started = (NOW - timedelta(seconds=90)).isoformat().replace("+00:00", "Z")
    p = pod(
        "kimi-server-0",
        conditions=[{"type": "Ready", "status": "True"}],
        containerStatuses=[{"name": "server", "restartCount": 0, "state": {"running": {"startedAt": started}}}],
    )
    assert o.server_observation([p], STS, 1, ["u"], {"kimi-server-0": True}, NOW).instances[0].ready
    not_serving = o.server_observation([p], STS, 1, ["u"], {"kimi-server-0": False}, NOW).instances[0]
    assert not not_serving.ready and not_serving.loading_seconds == pytest.approx(90)
    old = {**STS, "status": {"updateRevision": "r2"}}
    assert not o.server_observation([p], old, 1, ["u"], {"kimi-server-0": True}, NOW).instances[0].ready
    assert o.pods_to_probe([p, pod("kimi-server-3")], "kimi-server", 1) == [("kimi-server-0", 0)]


def test_crash_loop_shows_the_last_exit() -> None:
    p = pod(
        "kimi-server-0",
        containerStatuses=[
            {
                "name": "server",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 2, "message": "argument --reasoning-parser: invalid choice"}},
            }
        ],
    )
    (instance,) = o.server_observation([p], STS, 1, ["u"], {}, NOW).instances
    assert instance.waiting_reason == "CrashLoopBackOff" and instance.restarts == 4
    assert instance.last_exit == "exit 2: argument --reasoning-parser: invalid choice"


def test_workers_from_the_indexed_job_status() -> None:
    job = {"spec": {"suspend": False}, "status": {"completedIndexes": "0-2,5", "active": 2}}
    observed = o.workers_observation(job, [], 8)
    assert observed is not None and observed.shards_done == 4 and observed.active == 2 and not observed.shards_failed
    failed = {"spec": {}, "status": {"failedIndexes": "3"}}
    crashed = {
        "metadata": {"name": "w-3"},
        "status": {
            "containerStatuses": [
                {"name": "worker", "state": {"terminated": {"exitCode": 2, "message": "dataset: no such file"}}}
            ]
        },
    }
    observed = o.workers_observation(failed, [crashed], 8)
    assert observed is not None and observed.shards_failed == 1
    assert "exit 2: dataset: no such file" in (observed.failure_message or "")
    assert o.workers_observation(None, [], 8) is None


def test_progress_sums_the_shard_configmaps() -> None:
    cms = [
        {
            "data": {
                "progress.json": orjson.dumps(
                    {
                        "shard": 0,
                        "shard_count": 2,
                        "prompts_total": 5,
                        "prompts_done": 2,
                        "records_done": 2,
                        "state": "running",
                        "tokens_per_s": 10.0,
                    }
                ).decode()
            }
        },
        {
            "data": {
                "progress.json": orjson.dumps(
                    {
                        "shard": 1,
                        "shard_count": 2,
                        "prompts_total": 5,
                        "prompts_done": 5,
                        "records_done": 5,
                        "state": "complete",
                        "tokens_per_s": 99.0,
                    }
                ).decode()
            }
        },
        {"data": {}},
        {"data": {"progress.json": "not json"}},
    ]
    counters = o.progress_counters(cms)
    assert counters is not None
    assert (counters.prompts_total, counters.prompts_done, counters.counts.records) == (10, 7, 7)
    assert counters.tokens_per_second == 10.0  # finished shards do not count towards the rate
    assert o.progress_counters([{"data": {}}]) is None


def test_step_outcome_only_from_a_verdict() -> None:
    verdict = StepOutcome(True, "Passed", "11/11 canary outputs pass")
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    with_message = {
        "status": {
            "containerStatuses": [
                {"name": "canary", "state": {"terminated": {"exitCode": 0, "message": verdict.for_storage().decode()}}}
            ]
        }
    }
    assert o.job_outcome(done, [with_message], "canary", "canary") == verdict
    silent = {"status": {"containerStatuses": [{"name": "canary", "state": {"terminated": {"exitCode": 0}}}]}}
    outcome = o.job_outcome(done, [silent], "canary", "canary")
    assert outcome is not None and not outcome.passed and outcome.reason == "NoVerdict"
    assert o.job_outcome({"status": {}}, [], "canary", "canary") is None
    assert o.job_outcome(None, [], "canary", "canary") is None
