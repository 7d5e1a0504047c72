"""control.policy: the shard retry policy, defined once and read by the Job builder and the local runner."""

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
)
from datagen_operator.control.policy import (
    FREE_EXITS,
    PERMANENT_EXITS,
    SHARD_RETRIES,
    ShardExit,
    shard_exit,
)
from datagen_operator.k8s import manifests as m

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kimi-k2.5.yaml"


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
    job = m.workers_job(m.RunRef("kimi", "ml", "u"), spec, "img:1", ["http://a"], suspend=False)["spec"]
    assert job["backoffLimitPerIndex"] == SHARD_RETRIES
    rules = {r["action"]: r["onExitCodes"]["values"] for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r}
    assert set(rules["Ignore"]) == set(FREE_EXITS)
    assert set(rules["FailIndex"]) == set(PERMANENT_EXITS)


def test_the_local_runner_has_no_retry_rule_of_its_own() -> None:
    import datagen_operator.local.runner as runner

    for name in ("MAX_SHARD_RETRIES", "PERMANENT_WORKER_EXITS", "FREE_WORKER_EXITS"):
        assert not hasattr(runner, name)
    assert not hasattr(m, "WORKER_BACKOFF_LIMIT_PER_INDEX")
