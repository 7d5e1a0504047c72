"""api.progress.Counts: the one counter of a shard, a run and an output; summed once, stored flat beside a shard's
progress, and read back from what older workers wrote."""

from __future__ import annotations

from collections import Counter

import orjson

from datagen_operator.api.flags import ABORTED, TRUNCATED
from datagen_operator.api.progress import TOO_LONG, UNRENDERABLE, Counts, ShardProgress, sum_counts

A = Counts(records=3, prompt_tokens=30, output_tokens=300, flags=Counter({TRUNCATED: 1}), lines=5,
           set_aside={"bad_json": 1, TOO_LONG: 1}, records_set_aside=2, refused=1)  # fmt: skip
B = Counts(records=2, tool_records=1, flags=Counter({TRUNCATED: 1, ABORTED: 1}), lines=3,
           set_aside={TOO_LONG: 2}, failed=1, unwritten=1)  # fmt: skip


def test_the_sum_adds_every_count_and_each_cause_apart() -> None:
    total = sum_counts([A, B])
    assert total == A + B
    assert (total.records, total.tool_records, total.prompt_tokens, total.output_tokens) == (5, 1, 30, 300)
    assert total.flags == {TRUNCATED: 2, ABORTED: 1} and total.lines == 8
    assert total.set_aside == {"bad_json": 1, TOO_LONG: 3} and (total.too_long, total.unusable) == (3, 1)
    assert (total.records_set_aside, total.refused, total.failed, total.unwritten) == (2, 1, 1, 1)
    # Server refusals and prompts set aside are never the same count.
    assert total.refused == 1 and sum(total.set_aside.values()) == 4


def test_a_baseline_taken_off_leaves_the_rest_and_no_empty_causes() -> None:
    assert (A + B) - A == B
    assert (A - A).set_aside == {} and not (A - A).flags
    assert sum_counts([]) == Counts()


def test_merge_is_the_in_place_sum() -> None:
    merged = Counts()
    merged.merge(A)
    merged.merge(B)
    assert merged == A + B and A.records == 3  # the operands are left as they were


def test_the_storage_round_trip_keeps_every_count() -> None:
    total = A + B
    assert Counts.from_storage(orjson.loads(orjson.dumps(total.for_storage()))) == total
    # A segment summary written before the newer counts read them as 0.
    assert Counts.from_storage({"records": 2, "flags": {TRUNCATED: 1}}) == Counts(2, flags=Counter({TRUNCATED: 1}))


def test_a_shard_stores_its_counts_flat_under_the_names_it_always_had() -> None:
    p = ShardProgress(0, 2, "running", prompts_total=4, counts=A + B)
    stored = orjson.loads(p.for_storage())
    assert (stored["records_done"], stored["records_rejected"], stored["records_failed"]) == (5, 1, 1)
    assert (stored["records_unwritten"], stored["dataset_lines"], stored["set_aside"]) == (
        1,
        8,
        {"bad_json": 1, TOO_LONG: 3},
    )
    assert "counts" not in stored
    back = ShardProgress.from_storage(p.for_storage())
    assert back == p and back.malformed_lines == 8 - 4


def test_an_older_workers_snapshot_reads_into_the_same_counts() -> None:
    """progress.json or a shard ConfigMap written before Counts: no dataset_lines; without set_aside, the prompts
    set aside in three numbers."""
    old = {"shard": 1, "shard_count": 2, "state": "running", "prompts_total": 10, "prompts_malformed": 2,
           "prompts_rejected": 1, "prompts_too_long": 3, "records_done": 7, "records_rejected": 4,
           "records_set_aside": 5, "records_failed": 1, "records_unwritten": 2, "flags": {TRUNCATED: 2},
           "output_tokens": 70, "baseline": {"records": 1}}  # fmt: skip
    counts = ShardProgress.from_storage(orjson.dumps(old)).counts
    assert counts == Counts(records=7, output_tokens=70, flags=Counter({TRUNCATED: 2}), lines=12,
                            set_aside={"malformed": 2, UNRENDERABLE: 1, TOO_LONG: 3}, records_set_aside=5,
                            refused=4, failed=1, unwritten=2)  # fmt: skip
    with_causes = {**old, "set_aside": {"bad_json": 2, UNRENDERABLE: 1, TOO_LONG: 3}}
    assert ShardProgress.from_storage(orjson.dumps(with_causes)).counts.set_aside == with_causes["set_aside"]
