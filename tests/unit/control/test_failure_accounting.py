"""Every item set aside or refused counts under its own cause, with its own rate and threshold; a halt on
items an earlier attempt set aside is not repeated on resume; a failed output volume is named in plain words."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from datagen_operator.api.flags import NO_THINK_END
from datagen_operator.api.progress import Counts, ShardProgress
from datagen_operator.checks.evaluate import (
    MALFORMED,
    OUTPUT_VOLUME,
    SERVER_ERRORS,
    SERVER_FAILURES,
    TOO_LONG,
    evaluate,
)
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from datagen_operator.control.observed import WorkersObservation
from datagen_operator.control.progress import counters_from_snapshots
from tests.unit.decide_world import conditions, context, running, spec

CTX = context(spec())


def failing(counts: Counts) -> set[str]:
    return {check.name for check in evaluate(counts, CTX) if not check.passed}


def shard(**fields) -> ShardProgress:
    """A worker's snapshot read back as the operator reads it (stored keys: records_done, flags...)."""
    stored = {"shard": 0, "shard_count": 1, "state": "running", "prompts_total": 42, "started_at": 100.0, **fields}
    return ShardProgress.from_storage(orjson.dumps(stored))


def test_an_unrenderable_prompt_is_malformed_never_a_server_error() -> None:
    # The run: one dataset line the template cannot render, 42 records: `server_errors 1/43` before.
    counters = counters_from_snapshots([shard(records_done=42, set_aside={"unrenderable": 1})])
    results = {check.name: check for check in evaluate(counters.counts, CTX)}
    assert (results[SERVER_ERRORS].count, results[SERVER_ERRORS].passed) == (0, True)
    assert (results[MALFORMED].count, results[MALFORMED].total, results[MALFORMED].passed) == (1, 42, True)


@pytest.mark.parametrize(
    ("counts", "cause"),
    [
        # Over 1,000 the fewest that are clearly over each limit (checks.rates: the 95% lower bound above it).
        (Counts(records=900, lines=1000, set_aside={"bad_json": 117}), MALFORMED),  # 11.7 % against 10 %
        (Counts(records=900, lines=1000, set_aside={"too_long": 117}), TOO_LONG),  # 11.7 % against 10 %
        (Counts(records=984, refused=16), SERVER_ERRORS),  # 1.6 % against maxErrorRate 1 %
        (Counts(records=937, failed=63), SERVER_FAILURES),  # 6.3 % against 5 %
        (Counts(records=999, unwritten=1), OUTPUT_VOLUME),  # any
    ],
)
def test_each_cause_crosses_only_its_own_threshold(counts: Counts, cause: str) -> None:
    assert failing(counts) == {cause}
    just_under = {
        MALFORMED: Counts(records=900, lines=1000, set_aside={"bad_json": 116}),
        TOO_LONG: Counts(records=900, lines=1000, set_aside={"too_long": 116}),
        SERVER_ERRORS: Counts(records=985, refused=15),
        SERVER_FAILURES: Counts(records=938, failed=62),
        OUTPUT_VOLUME: Counts(records=1000),
    }[cause]
    assert failing(just_under) == set()


def test_the_rolling_checks_judge_the_whole_output_across_a_resume() -> None:
    """Records resumed from count with the new ones (the preflight judged them first, by the same checks): a
    resumed output whose flagged records stay over a threshold is not passed on this attempt's records alone."""
    s = spec()
    first = shard(records_done=50, flags={NO_THINK_END: 10}, set_aside={"bad_json": 9})
    d = decide(s, replace(running(Counts()), progress=counters_from_snapshots([first])), context(s))
    assert conditions(d)["Succeeded"] == ("False", "ChecksFailed")

    # 20 new clean records: 10/70 still lack the closer, above 2%.
    resumed = shard(records_done=70, flags={NO_THINK_END: 10}, set_aside={"bad_json": 9})
    counters = counters_from_snapshots([resumed])
    assert counters.counts.records == 70 and counters.counts.unusable == 9  # each line set aside counted once
    d = decide(s, replace(running(Counts()), progress=counters), context(s))
    assert conditions(d)["DataFaithful"][0] == "False"

    # A whole output within thresholds passes.
    clean = shard(records_done=500, prompts_total=500, flags={NO_THINK_END: 5}, set_aside={"bad_json": 9})
    d = decide(s, replace(running(Counts()), progress=counters_from_snapshots([clean])), context(s))
    assert d.step is Step.RUN_WORKERS and conditions(d)["DataFaithful"] == ("True", "WithinThresholds")


def test_snapshots_older_than_the_attempt_keep_their_records_not_their_losses() -> None:
    stale = shard(records_done=50, flags={NO_THINK_END: 10}, started_at=10.0, records_unwritten=3)
    counters = counters_from_snapshots([stale], attempt_started_at=20.0)
    assert counters.counts.records == 50 and counters.counts.count(NO_THINK_END) == 10
    assert counters.counts.unwritten == 0  # lost by that attempt; this one generates them again
    assert counters_from_snapshots([stale], attempt_started_at=5.0).counts.unwritten == 3


def test_a_full_volume_is_the_condition_in_plain_words() -> None:
    s = spec()
    full = shard(
        shard=0, state="failed", failure_reason="OutputVolumeFull", volume_path="/mnt/datagen/output",
        volume_free_bytes=0, records_done=80, records_total=150, records_unwritten=3,
    )  # fmt: skip
    other = shard(shard=1, records_done=87, records_total=150)
    counters = counters_from_snapshots([full, other])
    observed = replace(running(Counts()), progress=counters, workers=WorkersObservation(2, shards_failed=1))
    d = decide(s, observed, context(s))
    (succeeded,) = [u for u in d.updates if u.type == "Succeeded"]
    assert d.step is Step.HALTED and not d.server_wanted and not d.workers_wanted
    assert succeeded.reason == "OutputVolumeFull"  # not ChecksFailed although output_volume fails too
    assert succeeded.message == (
        "/mnt/datagen/output has 0 bytes free after 167/300 records; free space or grow the volume and the run "
        "resumes (shard 0 stopped)"
    )


def test_an_exit_code_alone_names_the_volume_when_no_progress_could_be_read() -> None:
    s = spec()
    workers = WorkersObservation(2, shards_failed=1, failure_reason="OutputVolumeFull", failure_message="/out full")
    d = decide(s, replace(running(Counts(records=5)), workers=workers), context(s))
    assert conditions(d)["Succeeded"] == ("False", "OutputVolumeFull")


def test_lost_answers_name_the_volume_before_the_runner_sees_the_exit_and_a_stale_failure_does_not() -> None:
    s = spec()
    full = shard(
        shard=0, state="failed", failure_reason="OutputVolumeFull", volume_path="/out", volume_free_bytes=0,
        records_done=80, records_total=150, records_unwritten=3, started_at=100.0,
    )  # fmt: skip
    fresh = replace(running(Counts()), progress=counters_from_snapshots([full]))
    assert conditions(decide(s, fresh, context(s)))["Succeeded"] == ("False", "OutputVolumeFull")
    # The same snapshot left by an earlier `datagen run`: the resumed run goes on.
    stale = replace(running(Counts()), progress=counters_from_snapshots([full], attempt_started_at=200.0))
    assert decide(s, stale, context(s)).step is Step.RUN_WORKERS


def test_a_dataset_changed_while_generating_is_the_runs_cause_in_the_workers_words() -> None:
    # The worker's watch (worker/dataset_watch.py) names the change in its progress: the run halts on it, with
    # its message, not a generic WorkersFailed.
    s = spec()
    message = "spec.dataset.path /data/p.jsonl changed since this output was started: 1 line edited (line 6 (id 'p5'))"
    changed = shard(shard=0, state="failed", failure_reason="DatasetChanged", message=message, records_done=40)
    observed = replace(
        running(Counts()),
        progress=counters_from_snapshots([changed, shard(shard=1, records_done=41)]),
        workers=WorkersObservation(2, shards_failed=1),
    )
    d = decide(s, observed, context(s))
    (succeeded,) = [u for u in d.updates if u.type == "Succeeded"]
    assert d.step is Step.HALTED and (succeeded.status, succeeded.reason) == ("False", "DatasetChanged")
    assert "line 6 (id 'p5')" in succeeded.message and "{" not in succeeded.message
