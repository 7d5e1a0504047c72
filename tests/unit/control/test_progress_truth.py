"""What a run's progress and phase say (pure): the preflight's count of the dataset is the total from the start,
done counts the whole output so a resume never takes it back, and no column names a step the run is not at."""

from __future__ import annotations

import orjson

from datagen_operator.api.crd import crd_manifest
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts, ShardProgress
from datagen_operator.api.status import Condition, DataGenRunStatus, Progress
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from datagen_operator.control.observed import Observed, ProgressCounters, ServerObservation, WorkersObservation
from datagen_operator.control.progress import counters_from_snapshots, progress_of
from datagen_operator.control.remembered import remembered_preflight
from tests.manifests import example_run
from tests.unit.decide_world import PASS, READY, context, spec

COUNTED = StepOutcome(True, "Passed", "2000 prompts in /data/prompts.jsonl; /out is new", prompts=2000)


def counters(records: int, read: int, done: int, rate: float = 5100.0, records_set_aside: int = 0) -> ProgressCounters:
    """The workers' sums: `read` prompts of the dataset read so far, `done` of them finished as they read."""
    counts = Counts(records=records, records_set_aside=records_set_aside)
    return ProgressCounters(prompts_total=read, prompts_done=done, tokens_per_second=rate, counts=counts)


def bulk(progress: ProgressCounters | None, preflight: StepOutcome = COUNTED) -> Observed:
    workers = WorkersObservation(2, active=2)
    return Observed(1, preflight=preflight, server=READY, parsers=PASS, canary=PASS, workers=workers, progress=progress)


def test_the_preflights_count_is_the_total_from_the_start() -> None:
    s = spec()
    waiting = decide(s, Observed(1, preflight=COUNTED, server=ServerObservation(1)), context(s))
    assert waiting.step is Step.WAIT_FOR_SERVER
    assert waiting.progress is not None and waiting.progress.summary == "0/2000 prompts"
    # The workers have read 256 prompts of 2,000 so far: their sum is not the total.
    reading = decide(s, bulk(counters(records=38, read=256, done=38)), context(s))
    assert reading.progress is not None
    assert reading.progress.summary == "38/2000 prompts, 5.1k tok/s"
    assert (reading.progress.prompts_total, reading.progress.records_total) == (2000, 2000)
    assert reading.progress.dataset_prompts == 2000


def test_progress_counts_the_whole_output_and_never_goes_back_on_a_resume() -> None:
    s = spec()
    before = decide(s, bulk(counters(records=146, read=384, done=146)), context(s)).progress
    # Resumed workers hold the 146 records (and 3 refused, 1 set aside) from disk before they read the dataset
    # again: as they read it, their own per-prompt count starts over.
    resumed = counters(records=146, read=203, done=94, records_set_aside=1, rate=0.0)
    after = decide(
        s, bulk(replace_counts(resumed, Counts(records=146, refused=3, records_set_aside=1))), context(s)
    ).progress
    assert before is not None and after is not None
    assert before.summary.startswith("146/2000 prompts")
    assert after.summary.startswith("150/2000 prompts") and after.prompts_done == after.records_done == 150
    assert after.records == 146


def replace_counts(c: ProgressCounters, counts: Counts) -> ProgressCounters:
    from dataclasses import replace

    return replace(c, counts=counts)


def test_several_samples_a_prompt_count_records_and_never_pass_the_total() -> None:
    p = progress_of(counters(records=7, read=4, done=1), 2, 0, dataset_prompts=10, samples=4)
    assert p.summary == "7/40 records, 5.1k tok/s"
    assert (p.prompts_total, p.prompts_done, p.records_total, p.records_done) == (10, 1, 40, 7)
    # A prompt set aside after some samples were recorded counts its samples twice in the workers' sums.
    over = progress_of(counters(records=40, read=10, done=10, rate=0.0, records_set_aside=4), 2, 2,
                       dataset_prompts=10, samples=4)  # fmt: skip
    assert over.summary == "40/40 records" and over.records_done == 40


def test_a_run_whose_preflight_did_not_count_shows_the_workers_numbers() -> None:
    s = spec()
    legacy = decide(s, bulk(counters(records=38, read=256, done=38), preflight=PASS), context(s)).progress
    assert legacy is not None and legacy.summary == "38/256 prompts, 5.1k tok/s" and legacy.dataset_prompts is None


def test_no_column_names_a_step_the_run_is_not_at() -> None:
    s = spec()
    checking = decide(s, Observed(1), context(s))
    assert checking.step is Step.PREFLIGHT and checking.progress is not None
    assert checking.progress.summary == "preflight running"
    refused = StepOutcome(False, "DatasetUnusable", "spec.dataset.path /data/x.jsonl holds no valid prompt")
    halted = decide(s, Observed(1, preflight=refused), context(s))
    assert (halted.step, halted.phase) == (Step.HALTED, "Halted")
    assert halted.progress is not None and halted.progress.summary == "halted at the preflight"
    # A halt at the canary: the dataset is counted and nothing was generated.
    canary = decide(s, Observed(1, preflight=COUNTED, server=READY, parsers=PASS,
                                canary=StepOutcome(False, "Failed", "x")), context(s))  # fmt: skip
    assert canary.phase == "Halted" and canary.progress is not None and canary.progress.summary == "0/2000 prompts"
    starting = decide(s, bulk(None, preflight=PASS), context(s))
    assert starting.progress is not None and starting.progress.summary == "workers starting"


def test_the_preflights_count_is_remembered_with_its_verdict() -> None:
    s = spec()
    first = decide(s, bulk(counters(records=38, read=256, done=38)), context(s))
    inputs = Condition(type="InputsVerified", status="True", reason="Passed", message=COUNTED.message,
                       last_transition_time="t", observed_generation=3)  # fmt: skip
    status = DataGenRunStatus(conditions=[inputs], progress=first.progress)
    stored = DataGenRunStatus.model_validate(orjson.loads(orjson.dumps(status.model_dump(mode="json"))))
    remembered = remembered_preflight(stored, 3)
    assert remembered is not None and remembered.passed and remembered.prompts == 2000
    assert remembered_preflight(stored, 4) is None, "a changed dataset is counted again"
    # The workers' ConfigMaps new (a resumed workers Job) and not yet written: the 38 records stay counted.
    again = decide(s, bulk(None, remembered), context(s)).progress
    assert again is not None and again.summary.startswith("38/2000 prompts"), again.summary
    # A status without the count (progress.datasetPrompts unset): the verdict stands, the total comes from the
    # workers.
    older = remembered_preflight(DataGenRunStatus(conditions=[inputs], progress=Progress(prompts_total=256)), 3)
    assert older is not None and older.prompts is None


def test_the_count_travels_in_the_termination_message() -> None:
    assert StepOutcome.from_storage(COUNTED.for_storage()) == COUNTED
    assert StepOutcome.from_storage(COUNTED.for_storage(limit=120)).prompts == 2000
    assert StepOutcome.from_storage(b'{"passed": true, "reason": "Passed", "message": "m"}').prompts is None


def test_the_workers_set_aside_samples_are_summed() -> None:
    snapshots = [
        ShardProgress(0, 2, "running", counts=Counts(records_set_aside=2)),
        ShardProgress(1, 2, "running", counts=Counts(records_set_aside=3)),
    ]
    assert counters_from_snapshots(snapshots).counts.records_set_aside == 5


def test_samples_per_prompt_reach_the_summary_through_decide() -> None:
    s = spec(example_run(**{"spec.generation.samplesPerPrompt": 2}))
    d = decide(s, bulk(counters(records=10, read=100, done=3)), context(s))
    assert d.progress is not None and d.progress.summary == "10/4000 records, 5.1k tok/s"


def test_the_columns_show_the_phase_and_a_refused_change_by_default() -> None:
    (version,) = crd_manifest()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Phase"]["jsonPath"] == ".status.phase" and "priority" not in columns["Phase"]
    assert columns["Spec"]["jsonPath"] == '.status.conditions[?(@.type=="SpecApplied")].reason'
    assert "priority" not in columns["Spec"]


def test_a_run_that_stops_shows_no_rate() -> None:
    from dataclasses import replace

    from datagen_operator.api.flags import TRUNCATED

    s = spec()
    truncated = ProgressCounters(prompts_total=256, prompts_done=50, tokens_per_second=5100,
                                 counts=Counts(records=50, flags={TRUNCATED: 50}))  # fmt: skip
    halted = decide(s, bulk(truncated), context(s))
    assert halted.step is Step.HALTED and halted.progress is not None
    assert halted.progress.summary == "50/2000 prompts", "the workers are being paused: no rate is theirs now"
    suspended = decide(s, replace(bulk(counters(records=50, read=256, done=50)), suspended=True), context(s))
    assert suspended.progress is not None and suspended.progress.summary == "50/2000 prompts"
    # One count: the event of the transition and the condition later say the same (the workers drain after it).
    later = decide(s, replace(bulk(counters(records=90, read=256, done=90)), suspended=True), context(s))
    said = {u.type: u.message for u in suspended.updates}
    assert said["Progressing"] == {u.type: u.message for u in later.updates}["Progressing"]
    assert "50" not in said["Progressing"] and later.progress is not None
    assert later.progress.summary == "90/2000 prompts"


def test_server_refusals_and_set_aside_prompts_are_shown_apart() -> None:
    counted = replace_counts(counters(records=5, read=10, done=10, rate=0.0),
                             Counts(records=5, refused=3, set_aside={"bad_json": 1, "too_long": 1}))  # fmt: skip
    p = progress_of(counted, 1, 1, dataset_prompts=10, rate=False)
    assert (p.refused, p.set_aside) == (3, {"bad_json": 1, "too_long": 1})
    assert p.summary == "8/10 prompts, 3 refused, 2 set aside"


def test_a_resume_counts_the_records_the_preflight_found_before_any_worker_has() -> None:
    """A resumed run whose workers have not published yet (their snapshots gone with an earlier attempt, a killed
    run's, or recreated ConfigMaps): its progress starts at the records the output holds, not 0."""
    s = spec()
    resumed = StepOutcome(True, "Passed", "2000 prompts; /out resumes (145 records pass the checks)", prompts=2000,
                          recorded=145)  # fmt: skip
    assert StepOutcome.from_storage(resumed.for_storage()).recorded == 145  # as a Job's termination message holds it
    starting = decide(s, bulk(None, resumed), context(s)).progress
    assert starting is not None and starting.summary.startswith("145/2000 prompts"), starting.summary
    counting = decide(s, bulk(counters(records=150, read=300, done=150), resumed), context(s)).progress
    assert counting is not None and counting.summary.startswith("150/2000 prompts")


def test_a_killed_attempts_snapshot_lends_no_rate() -> None:
    """A worker killed mid-run left its snapshot 'running' at 3k tok/s: the next attempt shows no such rate."""
    killed = ShardProgress(shard=0, shard_count=1, state="running", tokens_per_s=3000.0, started_at=100.0)
    assert counters_from_snapshots([killed], attempt_started_at=200.0).tokens_per_second == 0.0
    assert counters_from_snapshots([killed], attempt_started_at=50.0).tokens_per_second == 3000.0
