"""control.progress: the shards' progress snapshots summed for decide()."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from datagen_operator.api.flags import TRUNCATED
from datagen_operator.api.progress import STATES, Counts, ShardProgress
from datagen_operator.control.progress import counters_from_snapshots


def snapshot(state: str, **fields: object) -> ShardProgress:
    """A worker's snapshot as the operator reads it back from its ConfigMap."""
    return ShardProgress.from_storage(orjson.dumps({"shard": 0, "shard_count": 1, "state": state, **fields}))


def test_counters_from_worker_snapshots() -> None:
    running = ShardProgress(0, 2, "running", prompts_total=10, prompts_done=4, counts=Counts(refused=1, lines=10))
    running.tokens_per_s = 100.0
    for has_tools in (True, True, False, False):
        running.counts.add(10, 100, 0, (TRUNCATED,) if has_tools else (), has_tools)  # as the worker counts
    snapshots = [
        ShardProgress.from_storage(running.for_storage()),
        snapshot("complete", prompts_total=5, prompts_done=5, records_done=5, output_tokens=500, tokens_per_s=999.0,
                 flags={TRUNCATED: 1}),
    ]  # fmt: skip
    counters = counters_from_snapshots(snapshots)
    assert (counters.prompts_total, counters.prompts_done, counters.counts.output_tokens) == (15, 9, 900)
    assert counters.tokens_per_second == 100.0  # finished shards no longer produce
    expected = Counts(9, 2, prompt_tokens=40, output_tokens=900, flags=Counter({TRUNCATED: 3}), lines=15, refused=1)
    assert counters.counts == expected


@pytest.mark.parametrize("state", ["complete", "incomplete", "drained", "failed"])
def test_a_worker_that_exited_adds_no_rate(state: str) -> None:
    assert state in STATES
    snapshots = [snapshot("running", tokens_per_s=50.0), snapshot(state, tokens_per_s=999.0)]
    assert counters_from_snapshots(snapshots).tokens_per_second == 50.0


def test_set_aside_prompts_of_every_cause_are_counted() -> None:
    snapshots = [
        snapshot("running", prompts_malformed=1, set_aside={"bad_json": 1, "too_long": 2, "unrenderable": 1}),
        snapshot("running", prompts_malformed=3, set_aside={"bad_json": 2, "duplicate_id": 1}),
    ]
    counts = counters_from_snapshots(snapshots).counts
    assert counts.set_aside == {"bad_json": 3, "too_long": 2, "unrenderable": 1, "duplicate_id": 1}
    assert (counts.too_long, counts.duplicates, counts.unusable) == (2, 1, 4)  # a duplicate is not unusable
