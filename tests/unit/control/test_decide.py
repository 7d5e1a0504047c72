"""The run state machine, step by step, with the conditions a user sees."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from datagen_operator.api.flags import NO_THINK_END
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import DataGenRunStatus
from datagen_operator.control.conditions import apply_updates, transition_events
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import (
    HaltedBefore,
    Observed,
    ProbeFailures,
    ProgressCounters,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS
from datagen_operator.control.remembered import remembered_halt
from tests.manifests import example_run
from tests.unit.decide_world import PASS, READY, conditions, context, running, spec


def test_unschedulable_server_names_the_scheduler_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    server = ServerObservation(1, (ServerInstance("srv-0", scheduled=False, unschedulable_message=message),))
    d = decide(spec(), Observed(1, server=server), context(spec()))
    assert d.step is Step.WAIT_FOR_SERVER and d.server_wanted
    (ready,) = [u for u in d.updates if u.type == "ServerReady"]
    assert (ready.status, ready.reason) == ("False", "Unschedulable") and message in ready.message


def test_loading_then_timeout_releases_gpus() -> None:
    s = spec()
    loading = ServerObservation(1, (ServerInstance("srv-0", running=True, loading_seconds=600),))
    d = decide(s, Observed(1, server=loading), context(s))
    assert conditions(d)["ServerReady"] == ("False", "Loading")
    late = ServerObservation(1, (ServerInstance("srv-0", running=True, loading_seconds=3 * 3600),))
    d = decide(s, Observed(1, server=late), context(s))
    assert d.step is Step.HALTED and not d.server_wanted
    assert conditions(d)["Succeeded"] == ("False", "ServerFailed")


def test_crash_loop_with_invalid_args() -> None:
    crash = ServerInstance(
        "srv-0", restarts=3, waiting_reason="CrashLoopBackOff", last_exit="exit 2: invalid choice: 'bogus'"
    )
    d = decide(spec(), Observed(1, server=ServerObservation(1, (crash,))), context(spec()))
    assert conditions(d)["ServerReady"] == ("False", "InvalidArgs")


def test_order_parsers_then_canary_then_workers() -> None:
    s = spec()
    d = decide(s, Observed(1, server=READY), context(s))
    assert d.step is Step.VERIFY_PARSERS and not d.workers_wanted
    d = decide(s, Observed(1, server=READY, parsers=PASS), context(s))
    assert d.step is Step.RUN_CANARY and not d.workers_wanted
    d = decide(s, Observed(1, server=READY, parsers=PASS, canary=PASS), context(s))
    assert d.step is Step.RUN_WORKERS and d.workers_wanted
    assert conditions(d)["Progressing"] == ("True", "Running")


def test_parser_mismatch_halts_before_the_canary() -> None:
    s = spec()
    wrong = StepOutcome(
        False, "Mismatch", "the server's reasoning parser is `kimi` (◁think▷) but kimi-k2.5 writes <think>"
    )
    d = decide(s, Observed(1, server=READY, parsers=wrong), context(s))
    assert d.step is Step.HALTED and not d.server_wanted and not d.workers_wanted
    assert conditions(d)["Succeeded"] == ("False", "ParsersMismatch")


def test_warn_goes_on_with_the_condition_false() -> None:
    s = spec(example_run(**{"spec.checks.onFailure": "Warn"}))
    failed = StepOutcome(False, "Failed", "no </think>")
    d = decide(s, Observed(1, server=READY, parsers=PASS, canary=failed), context(s))
    assert d.step is Step.RUN_WORKERS
    assert conditions(d)["CanaryPassed"] == ("False", "Failed")


def test_failed_canary_halts_with_no_workers() -> None:
    s = spec()
    d = decide(s, Observed(1, server=READY, parsers=PASS, canary=StepOutcome(False, "Failed", "x")), context(s))
    assert d.step is Step.HALTED and not d.workers_wanted
    assert conditions(d)["Succeeded"] == ("False", "CanaryFailed")


def test_rolling_checks_flip_data_faithful_and_halt() -> None:
    s = spec()
    d = decide(s, running(Counts(records=5)), context(s))
    assert conditions(d)["DataFaithful"] == ("Unknown", "Collecting")
    d = decide(s, running(Counts(records=50)), context(s))
    assert conditions(d)["DataFaithful"] == ("True", "WithinThresholds")
    assert d.progress is not None and d.progress.summary == "50/100 prompts, 5.1k tok/s"
    d = decide(s, running(Counts(records=50, flags={NO_THINK_END: 10})), context(s))
    assert conditions(d)["DataFaithful"] == ("False", "ThresholdCrossed")
    assert d.step is Step.HALTED and not d.workers_wanted


def test_all_shards_done_then_final_verification() -> None:
    s = spec()
    d = decide(s, running(Counts(records=100), done=8), context(s))
    assert d.step is Step.FINAL_VERIFY
    observed = running(Counts(records=100), done=8)
    final = Observed(**{**observed.__dict__, "final": PASS})
    d = decide(s, final, context(s))
    assert d.step is Step.DONE and not d.server_wanted
    assert conditions(d)["Succeeded"] == ("True", "Completed")


def test_suspend_releases_gpus() -> None:
    d = decide(spec(), Observed(1, suspended=True, server=READY), context(spec()))
    assert d.step is Step.SUSPENDED and not d.server_wanted and not d.workers_wanted
    assert conditions(d)["ServerReady"] == ("False", "Suspended")


def test_last_transition_time_moves_only_on_status_change_and_events_follow() -> None:
    s = spec()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = apply_updates([], decide(s, Observed(1, server=READY), context(s)).updates, t0, 1)
    second = apply_updates(
        first, decide(s, Observed(1, server=READY), context(s)).updates, t0 + timedelta(minutes=5), 1
    )
    assert first == second
    third = apply_updates(
        second, decide(s, Observed(1, server=READY, parsers=PASS), context(s)).updates, t0 + timedelta(minutes=9), 1
    )
    by_type = {c.type: c for c in third}
    assert by_type["ParsersVerified"].last_transition_time == "2026-01-01T00:09:00Z"
    assert by_type["ServerReady"].last_transition_time == "2026-01-01T00:00:00Z"
    events = transition_events(second, third)
    assert any(e.reason == "ParsersVerifiedPassed" and e.type == "Normal" for e in events)


def test_a_new_run_starts_with_the_preflight_and_no_server() -> None:
    s = spec()
    d = decide(s, Observed(1, server=ServerObservation(1)), context(s))
    assert d.step is Step.PREFLIGHT and not d.server_wanted and not d.workers_wanted
    assert conditions(d)["InputsVerified"] == ("Unknown", "Checking")
    assert conditions(d)["ServerReady"] == ("False", "NotStarted")


def test_a_failed_preflight_halts_before_any_server() -> None:
    s = spec()
    empty = StepOutcome(
        False, "DatasetUnusable", "spec.dataset.path /d.jsonl: the dataset is empty (1 lines, no prompt)"
    )
    d = decide(s, Observed(1, preflight=empty, server=ServerObservation(1)), context(s))
    assert d.step is Step.HALTED and not d.server_wanted
    assert conditions(d)["InputsVerified"] == ("False", "DatasetUnusable")
    assert conditions(d)["Succeeded"] == ("False", "PreflightFailed")
    (succeeded,) = [u for u in d.updates if u.type == "Succeeded"]
    assert "the dataset is empty" in succeeded.message


def test_a_passed_preflight_asks_for_the_server_and_stays_reported() -> None:
    s = spec()
    d = decide(s, Observed(1, preflight=PASS, server=ServerObservation(1)), context(s))
    assert d.step is Step.WAIT_FOR_SERVER and d.server_wanted
    assert conditions(d)["InputsVerified"] == ("True", "Passed")


def test_a_complete_output_goes_to_the_final_verification_without_a_server() -> None:
    s = spec()
    complete = StepOutcome(True, "Passed", "every record is there", prompts=24, complete=True)
    d = decide(s, Observed(1, preflight=complete, server=ServerObservation(1)), context(s))
    assert d.step is Step.FINAL_VERIFY and not d.server_wanted and not d.workers_wanted
    assert conditions(d)["ServerReady"] == ("False", "NotNeeded")
    assert d.progress is not None and d.progress.summary == "24/24 prompts"
    # The verdict, then: the run ends Succeeded with the whole output counted, no server ever asked for.
    verified = StepOutcome(True, "Verified", "ok")
    done = decide(s, Observed(1, preflight=complete, server=ServerObservation(1), final=verified), context(s))
    assert done.step is Step.DONE and conditions(done)["Succeeded"] == ("True", "Completed")
    assert done.progress is not None and done.progress.summary == "24/24 prompts"
    assert StepOutcome.from_storage(complete.for_storage()) == complete


def test_a_run_begun_without_a_preflight_verdict_is_not_sent_back() -> None:
    s = spec()
    d = decide(s, Observed(1, server=READY, parsers=PASS), context(s))
    assert d.step is Step.RUN_CANARY and d.server_wanted
    assert "InputsVerified" not in conditions(d)


def test_progress_of_a_finished_run_shows_no_rate() -> None:
    from datagen_operator.control.progress import progress_of

    running = ProgressCounters(prompts_total=10, prompts_done=4, tokens_per_second=1500.0)
    assert progress_of(running, 2, 0).summary == "4/10 prompts, 1.5k tok/s"
    finished = ProgressCounters(prompts_total=10, prompts_done=10, tokens_per_second=0.0)
    assert progress_of(finished, 2, 2).summary == "10/10 prompts"


def server_ready(decision) -> tuple[str, str]:
    return conditions(decision)["ServerReady"]


@pytest.mark.parametrize(
    "server",
    [
        None,
        ServerObservation(1),  # the pod is gone
        ServerObservation(1, (ServerInstance("srv-0", running=True, loading_seconds=3),)),  # stopping, not ready
        READY,
    ],
    ids=["no-statefulset", "no-pod", "not-ready", "still-ready"],
)
def test_finished_workers_release_the_server_and_never_ask_for_it_back(server) -> None:
    # The pass after the release sees the server stopping: it must not scale it up again (a model reload).
    s = spec()
    observed = replace(running(Counts(records=100), done=8), server=server)
    d = decide(s, observed, context(s))
    assert d.step is Step.FINAL_VERIFY and not d.server_wanted and not d.workers_wanted
    assert server_ready(d) == ("False", "Released")
    assert conditions(d)["ParsersVerified"] == ("True", "Passed") and conditions(d)["CanaryPassed"] == (
        "True",
        "Passed",
    )
    assert conditions(d)["Succeeded"] == ("Unknown", "Verifying")


def test_a_failed_shard_is_not_a_finished_run() -> None:
    s = spec()
    observed = replace(
        running(Counts(records=100), done=8), workers=WorkersObservation(8, shards_done=8, shards_failed=1)
    )
    d = decide(s, observed, context(s))
    assert d.step is Step.HALTED and conditions(d)["Succeeded"] == ("False", "WorkersFailed")


WRONG = StepOutcome(False, "Failed", "no </think>")
HALTS = {
    "ParsersMismatch": Observed(1, preflight=PASS, server=READY, parsers=WRONG),
    "CanaryFailed": Observed(1, preflight=PASS, server=READY, parsers=PASS, canary=WRONG),
    "ChecksFailed": running(Counts(records=50, flags={NO_THINK_END: 10})),
    "WorkersFailed": replace(running(Counts(records=5)), workers=WorkersObservation(8, shards_failed=1)),
    "ServerFailed": Observed(
        1, preflight=PASS, server=ServerObservation(1, (ServerInstance("srv-0", running=True, loading_seconds=1e6),))
    ),
    "PreflightFailed": Observed(1, preflight=WRONG),
    "ProbeFailed": Observed(
        1, preflight=PASS, server=READY, parser_probes=ProbeFailures(PARSER_PROBE_ATTEMPTS, "connection reset")
    ),
}


@pytest.mark.parametrize("reason", sorted(HALTS))
def test_every_halt_reads_server_ready_false(reason: str) -> None:
    s = spec()
    d = decide(s, HALTS[reason], context(s))
    assert d.step is Step.HALTED and not d.server_wanted
    assert conditions(d)["Succeeded"] == ("False", reason)
    assert server_ready(d)[0] == "False", "a halted run's StatefulSet goes to 0 replicas"


def test_a_run_with_a_verdict_reads_server_ready_false_even_if_the_server_still_answers() -> None:
    s = spec()
    done = replace(running(Counts(records=100), done=8), final=PASS)
    d = decide(s, done, context(s))
    assert d.step is Step.DONE and server_ready(d) == ("False", "Released")


def with_export(s: DataGenRunSpec) -> DataGenRunSpec:
    from datagen_operator.api.export_spec import ExportSpec

    return s.model_copy(update={"export": ExportSpec(formats=["speculators", "trl"])})


def test_a_verified_run_with_spec_export_exports_before_it_is_done() -> None:
    s = with_export(spec())
    verified = replace(running(Counts(records=100), done=8), final=PASS)
    d = decide(s, verified, context(s))
    assert d.step is Step.EXPORT and not d.server_wanted and not d.workers_wanted
    assert conditions(d)["Exported"] == ("Unknown", "Exporting")
    assert conditions(d)["Succeeded"] == ("Unknown", "Exporting")
    assert conditions(d)["DataFaithful"] == ("True", "Verified") and server_ready(d) == ("False", "Released")
    exported = StepOutcome(True, "Exported", "speculators: 100 rows, 51200 tokens; trl: 100 rows, 51200 tokens")
    d = decide(s, replace(verified, export=exported), context(s))
    assert d.step is Step.DONE and d.phase == "Succeeded"
    assert conditions(d)["Exported"] == ("True", "Exported") and conditions(d)["Succeeded"] == ("True", "Completed")
    assert next(u for u in d.updates if u.type == "Exported").message == exported.message
    # without spec.export, no Exported condition and no export step
    d = decide(spec(), replace(verified, export=exported), context(s))
    assert d.step is Step.DONE and "Exported" not in conditions(d)


def test_a_failed_export_fails_the_run_but_keeps_the_verified_data() -> None:
    s = with_export(spec())
    failed = StepOutcome(False, "ExportFailed", "trl: [Errno 28] No space left on device")
    d = decide(s, replace(running(Counts(records=100), done=8), final=PASS, export=failed), context(s))
    assert d.step is Step.DONE and d.phase == "Failed"
    assert conditions(d)["Exported"] == ("False", "ExportFailed")
    assert conditions(d)["Succeeded"] == ("False", "ExportFailed")
    assert conditions(d)["DataFaithful"] == ("True", "Verified")


def test_a_failed_verification_is_not_exported() -> None:
    s = with_export(spec())
    failed = StepOutcome(False, "ChecksFailed", "3 records failed")
    d = decide(s, replace(running(Counts(records=100), done=8), final=failed), context(s))
    assert d.step is Step.DONE and d.phase == "Failed" and "Exported" not in conditions(d)


@pytest.mark.parametrize("reason", sorted(HALTS))
def test_every_halt_is_written_as_halted_and_stands_with_its_phase(reason: str) -> None:
    """A halt is written into status.halted and read back from it (not from its reason): the next pass decides
    the same halt, with the same phase, without looking at anything else."""
    s = spec()
    d = decide(s, HALTS[reason], context(s))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = DataGenRunStatus(phase=d.phase, halted=d.halted, conditions=apply_updates([], d.updates, now, 1))
    remembered = remembered_halt(status, 1)
    assert d.halted and remembered is not None and remembered.reason == reason
    again = decide(s, Observed(1, halted=remembered, server=READY), context(s))
    assert (again.step, again.phase, again.updates) == (Step.HALTED, d.phase, ())
    expected = "Failed" if reason in ("ServerFailed", "WorkersFailed") else "Halted"
    assert d.phase == expected


def test_a_status_without_the_halted_field_is_read_by_its_reason() -> None:
    """A status an operator before status.halted wrote: its halt still stands after the upgrade."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    updates = decide(spec(), HALTS["CanaryFailed"], context(spec())).updates
    old = DataGenRunStatus(phase="Halted", conditions=apply_updates([], updates, now, 1))
    assert old.halted is None and remembered_halt(old, 1) is not None
    assert remembered_halt(old.model_copy(update={"halted": False}), 1) is None, "the field, once written, decides"


def test_an_invalid_spec_is_decided_by_decide() -> None:
    d = decide(None, Observed(2, spec_error="spec.server.extraArgs[0]: managed"), None)
    assert d.step is Step.INVALID and d.finished and not d.server_wanted and not d.workers_wanted
    (update,) = d.updates
    assert (update.type, update.status, update.reason) == ("Succeeded", "False", "InvalidSpec")
    assert "extraArgs[0]" in update.message
    # A parsed spec with an error observed is still invalid: the error wins over every other step.
    s = spec()
    assert decide(s, Observed(2, spec_error="bad", server=READY), context(s)).step is Step.INVALID


def test_reconcile_has_no_invalid_or_halt_rule_of_its_own() -> None:
    import datagen_operator.k8s.reconcile as reconcile

    for name in ("decide_invalid", "HALT_REASONS"):
        assert not hasattr(reconcile, name)
    assert not hasattr(reconcile.Reconciler, "_halted")


def test_a_remembered_halt_stands_and_asks_for_nothing() -> None:
    s = spec()
    halted = HaltedBefore(reason="CanaryFailed", checks=(), progress=None)
    # Even with a ready server and passing verdicts observed, the halt stands until the spec changes.
    d = decide(s, Observed(3, halted=halted, server=READY, parsers=PASS, canary=PASS), context(s))
    assert d.step is Step.HALTED and d.phase == "Halted" and d.finished
    assert not d.server_wanted and not d.workers_wanted and not d.canary_wanted and d.updates == ()


def test_a_failed_parser_probe_is_retried_a_bounded_number_of_times_then_halts() -> None:
    s = spec()
    steps = []
    for count in range(PARSER_PROBE_ATTEMPTS + 1):
        observed = Observed(1, preflight=PASS, server=READY, parser_probes=ProbeFailures(count, "HTTP 502"))
        steps.append(decide(s, observed, context(s)))
    retried = [d for d in steps if d.step is Step.VERIFY_PARSERS]
    assert len(retried) == PARSER_PROBE_ATTEMPTS, "every attempt before the bound keeps verifying"
    assert all(conditions(d)["ParsersVerified"] == ("Unknown", "Verifying") for d in retried)
    assert "attempt 2 of" in next(u.message for u in retried[2].updates if u.type == "ParsersVerified")
    last = steps[-1]
    assert last.step is Step.HALTED and not last.server_wanted and not last.canary_wanted
    assert conditions(last)["ParsersVerified"] == ("False", "ProbeFailed")
    assert conditions(last)["Succeeded"] == ("False", "ProbeFailed")
    assert "HTTP 502" in next(u.message for u in last.updates if u.type == "Succeeded")


def test_a_probe_verdict_wins_over_earlier_failed_probes() -> None:
    s = spec()
    observed = Observed(1, preflight=PASS, server=READY, parsers=PASS, parser_probes=ProbeFailures(9, "x"))
    assert decide(s, observed, context(s)).step is Step.RUN_CANARY


def test_the_canary_starts_only_after_the_parsers_are_verified() -> None:
    s = spec()
    verifying = decide(s, Observed(1, preflight=PASS, server=READY), context(s))
    assert verifying.step is Step.VERIFY_PARSERS and not verifying.canary_wanted
    canary = decide(s, Observed(1, preflight=PASS, server=READY, parsers=PASS), context(s))
    assert canary.step is Step.RUN_CANARY and canary.canary_wanted
    wanted = [
        d.step for d in (verifying, canary, *(decide(s, o, context(s)) for o in HALTS.values())) if d.canary_wanted
    ]
    assert wanted == [Step.RUN_CANARY]


def test_decision_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Decision(Step.DONE, True)  # type: ignore[misc]


def _parser_worlds() -> list[Observed]:
    loading = ServerObservation(1, (ServerInstance("srv-0", running=True, loading_seconds=60),))
    half = ServerObservation(
        2,
        (
            ServerInstance("srv-0", running=True, ready=True, endpoint="http://srv-0:30000"),
            ServerInstance("srv-1", running=True, loading_seconds=60),
        ),
    )
    failed_probes = ProbeFailures(PARSER_PROBE_ATTEMPTS, "timed out")
    halted = HaltedBefore(reason="CanaryFailed", checks=(), progress=None)
    return [
        Observed(1),
        Observed(1, server=loading),
        Observed(1, server=half),
        Observed(1, server=READY),
        Observed(1, server=READY, parser_probes=ProbeFailures(1, "reset")),
        Observed(1, server=READY, parser_probes=failed_probes),
        Observed(1, server=READY, parsers=PASS),
        Observed(1, server=READY, parsers=PASS, canary=PASS),
        Observed(1, server=READY, suspended=True),
        Observed(1, server=READY, halted=halted),
        Observed(1, server=READY, final=PASS),
    ]


@pytest.mark.parametrize("observed", _parser_worlds())
def test_the_parsers_are_read_exactly_when_decide_would_wait_for_them(observed: Observed) -> None:
    """The shell reads the server's parsers while it observes (`parsers_to_read`), so `decide` runs once a
    pass: the read is due in exactly the worlds where `decide` says the step is to verify them."""
    from datagen_operator.control.decide import parsers_to_read

    s = spec()
    waiting = decide(s, observed, context(s)).step is Step.VERIFY_PARSERS
    assert parsers_to_read(s, observed) == (waiting and bool(observed.server and observed.server.ready_endpoints))
