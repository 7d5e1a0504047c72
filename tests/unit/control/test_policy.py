"""control.policy: the shard retry policy, the worker's drain and the server restarts, each defined once and read
by the Job builder, the worker and the local runner."""

from __future__ import annotations

from pathlib import Path

import yaml

from datagen_operator.api import parse_run
from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_OK,
    EXIT_OUTPUT_VOLUME,
    EXIT_SERVER_UNREACHABLE,
    WORKER_DRAIN_S,
    WORKER_GRACE_S,
)
from datagen_operator.control.policy import (
    FREE_EXITS,
    PERMANENT_EXITS,
    SERVER_RESTARTS,
    SHARD_RETRIES,
    ShardExit,
    server_restart_delay_s,
    shard_exit,
)
from datagen_operator.k8s import job_manifests, object_meta

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kimi-k2.5.yaml"


def crashes_until_failed(code: int) -> int:
    """How many times a shard that always exits `code` runs before it fails for good (bounded at 100)."""
    retries = 0
    for runs in range(1, 101):
        verdict = shard_exit(code, retries)
        if verdict is ShardExit.FAILED:
            return runs
        if verdict is ShardExit.RETRY:
            retries += 1
    return 101


def test_a_crashing_shard_runs_one_plus_its_retries_then_fails() -> None:
    assert crashes_until_failed(137) == SHARD_RETRIES + 1 == 4
    assert crashes_until_failed(EXIT_BAD_INPUT) == 1 and crashes_until_failed(EXIT_OUTPUT_VOLUME) == 1
    # An outage or a drain never burns a retry: such a shard is retried without end (here: past the bound).
    assert crashes_until_failed(EXIT_SERVER_UNREACHABLE) == crashes_until_failed(EXIT_DRAINED) == 101
    assert shard_exit(EXIT_OK, SHARD_RETRIES) is ShardExit.DONE


def test_the_workers_job_reads_the_same_policy() -> None:
    spec = parse_run(yaml.safe_load(EXAMPLE.read_text())).spec
    run = object_meta.RunRef("kimi", "ml", "u")
    job = job_manifests.workers_job(run, spec, "img:1", ["http://a"], suspend=False)["spec"]
    assert job["backoffLimitPerIndex"] == SHARD_RETRIES
    rules = {r["action"]: r["onExitCodes"]["values"] for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r}
    assert set(rules["Ignore"]) == set(FREE_EXITS)
    assert set(rules["FailIndex"]) == set(PERMANENT_EXITS)


def test_the_local_runner_has_no_retry_rule_of_its_own() -> None:
    import datagen_operator.local.runner as runner

    for name in ("MAX_SHARD_RETRIES", "PERMANENT_WORKER_EXITS", "FREE_WORKER_EXITS", "MAX_SERVER_RESTARTS"):
        assert not hasattr(runner, name)
    assert not hasattr(job_manifests, "WORKER_BACKOFF_LIMIT_PER_INDEX")


def test_a_stopped_worker_drains_and_syncs_before_it_is_killed() -> None:
    from datagen_operator.local import runner
    from datagen_operator.worker.config import WorkerConfig, build_parser

    assert WORKER_GRACE_S > WORKER_DRAIN_S
    assert build_parser().get_default("drain_timeout") == WorkerConfig.drain_timeout_s == WORKER_DRAIN_S
    spec = parse_run(yaml.safe_load(EXAMPLE.read_text())).spec
    job = job_manifests.workers_job(object_meta.RunRef("kimi", "ml", "u"), spec, "img:1", ["http://a"], suspend=False)
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == WORKER_GRACE_S
    assert runner.WORKER_GRACE_S == WORKER_GRACE_S


def test_a_server_is_restarted_with_a_growing_wait_then_given_up() -> None:
    delays = [server_restart_delay_s(restarts) for restarts in range(SERVER_RESTARTS + 2)]
    waits = delays[:SERVER_RESTARTS]
    assert all(isinstance(wait, float) and wait > 0 for wait in waits)
    assert waits == sorted(waits) and len(set(waits)) == len(waits)
    assert delays[SERVER_RESTARTS:] == [None, None]
