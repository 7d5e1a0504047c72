"""The run's state machine: one pure function from (spec, observed) to conditions and the next step.

The operator and the local runner both call `decide` on every pass and only differ in how they carry out
the step (pods and Jobs vs processes). Steps run in order, each gated on the one before:
inputs verified (preflight) -> server ready -> parsers verified -> canary passed -> workers -> final verification
-> export (only with spec.export) -> done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import KUEUE_TOOK_BACK, KUEUE_WAITING, Reason
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import (
    CANARY_PASSED,
    DATA_FAITHFUL,
    EXPORTED,
    INPUTS_VERIFIED,
    PARSERS_VERIFIED,
    PROGRESSING,
    SERVER_READY,
    SUCCEEDED,
    CheckResult,
    ConditionStatus,
    Progress,
)
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks.evaluate import MIN_RECORDS_TO_JUDGE, CheckContext, by_turn_words, evaluate
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import Observed
from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS
from datagen_operator.control.progress import run_progress
from datagen_operator.control.server import EXTERNAL_NOT_OWNED, released_message, server_verdict


def _u(type_: str, status: ConditionStatus, reason: str, message: str = "") -> ConditionUpdate:
    return ConditionUpdate(type_, status, reason, message)


def decide(spec: DataGenRunSpec | None, observed: Observed, context: CheckContext | None) -> Decision:
    """`spec` and `context` are None when the spec does not parse (then `observed.spec_error` says why)."""
    if observed.spec_error is not None or spec is None or context is None:
        message = observed.spec_error or "the spec did not parse"
        return Decision(step=Step.INVALID, updates=(_u(SUCCEEDED, "False", Reason.INVALID_SPEC, message),))
    if observed.halted is not None:
        # A halt stands until the spec changes: nothing is asked for again (not even the server).
        halted = observed.halted
        return Decision(step=Step.HALTED, failed=halted.failed, checks=halted.checks, progress=halted.progress)
    external = spec.server.external is not None
    return _server_released_reads_false(_verdicts_recorded(_decide(spec, observed, context), observed), external)


def parsers_to_read(spec: DataGenRunSpec, observed: Observed) -> bool:
    """Whether a pass reads the server's parsers before it decides: a server is ready by the rule `decide`
    judges it by, and no verdict on its parsers stands. The shell asks this while it observes, so the probe's
    answer is an observed fact of the same pass and `decide` is called once."""
    if observed.halted is not None or observed.parsers is not None or observed.final is not None:
        return False
    if observed.suspended or _probe_gave_up(observed) is not None:
        return False
    if observed.server is None or not observed.server.ready_endpoints:
        return False
    if observed.server.external and (observed.preflight is None or not observed.preflight.passed):
        return False  # an external server answers before the preflight: its parsers are read after it, in order
    return server_verdict(observed.server, spec.server.startup_timeout).condition.status == "True"


def _verdicts_recorded(decision: Decision, observed: Observed) -> Decision:
    """Every step verdict observed is written into its condition, whatever step the run is on (a canary verdict
    that comes in while the server is down, a preflight's while suspended): the pod whose termination message
    holds it may be gone by the next pass (users, pod GC, namespace deletion), and then the condition is the only
    record left of it."""
    said = {update.type for update in decision.updates}
    verdicts = (
        (INPUTS_VERIFIED, observed.preflight),
        (PARSERS_VERIFIED, observed.parsers),
        (CANARY_PASSED, observed.canary),
    )
    missing = tuple(
        _u(type_, "True" if outcome.passed else "False", outcome.reason, outcome.message)
        for type_, outcome in verdicts
        if outcome is not None and type_ not in said
    )
    return replace(decision, updates=decision.updates + missing) if missing else decision


def _server_released_reads_false(decision: Decision, external: bool) -> Decision:
    """One rule for every step that releases the server (halts, the end, final verification): ServerReady
    cannot stay True over a server that is being scaled to zero, whatever the last look at it said."""
    if decision.server_wanted:
        return decision
    why = {Step.FINAL_VERIFY: "all shards done", Step.EXPORT: "run finished", Step.DONE: "run finished"}.get(
        decision.step, "run halted"
    )
    released = _u(SERVER_READY, "False", Reason.RELEASED, released_message(why, external=external))
    updates = tuple(released if u.type == SERVER_READY and u.status == "True" else u for u in decision.updates)
    return replace(decision, updates=updates)


@dataclass
class _Pass:
    """What every step of one decision reads, computed once; `updates` gathers the conditions of the steps the
    run is past, in order, for the step that decides."""

    spec: DataGenRunSpec
    observed: Observed
    context: CheckContext
    progress: Progress
    stopped_at: Progress
    """The progress of a run that stops now (no rate)."""
    begun: bool
    """The run got past the preflight (a server, a gate verdict or workers observed)."""
    updates: list[ConditionUpdate] = field(default_factory=list)

    @property
    def started(self) -> bool:
        """Bulk work started: the workers exist."""
        return self.observed.workers is not None

    @property
    def external(self) -> bool:
        """server.external: the run owns no server (ServerReady's words say so)."""
        return self.spec.server.external is not None

    @property
    def halt_on_failure(self) -> bool:
        return self.spec.checks.on_failure == "Halt"

    def decision(
        self,
        step: Step,
        *,
        failed: bool = False,
        server_wanted: bool = False,
        workers_wanted: bool = False,
        updates: tuple[ConditionUpdate, ...] | None = None,
        checks: tuple[CheckResult, ...] = (),
        progress: Progress | None = None,
    ) -> Decision:
        """The step's decision over the conditions gathered so far, or over `updates` of its own alone."""
        return Decision(
            step=step,
            failed=failed,
            server_wanted=server_wanted,
            workers_wanted=workers_wanted,
            updates=tuple(self.updates) if updates is None else updates,
            checks=checks,
            progress=self.progress if progress is None else progress,
        )

    @classmethod
    def of(cls, spec: DataGenRunSpec, observed: Observed, context: CheckContext) -> _Pass:
        workers = observed.workers
        # A run that got further (a server, a gate verdict or workers observed) with no preflight verdict at hand
        # is not sent back to the preflight.
        begun = observed.parsers is not None or observed.canary is not None or workers is not None
        # An external server's URLs are probed from the first pass: its answering is no sign of progress.
        begun = begun or bool(observed.server and observed.server.instances and not observed.server.external)
        progress, stopped_at = run_progress(spec, observed, begun)
        return cls(spec, observed, context, progress, stopped_at, begun)


def _decide(spec: DataGenRunSpec, observed: Observed, context: CheckContext) -> Decision:
    """The first step in STEPS that decides; each one before it has added its conditions."""
    run = _Pass.of(spec, observed, context)
    for step in STEPS:
        decision = step(run)
        if decision is not None:
            return decision
    raise AssertionError("bulk generation decides every run that got this far")


def _finished(run: _Pass) -> Decision | None:
    """A finished run stays finished: its verdict is final and the GPUs are released."""
    final = run.observed.final
    if final is None:
        return None
    spec, progress = run.spec, run.progress
    verdict = _u(
        DATA_FAITHFUL,
        "True" if final.passed else "False",
        Reason.VERIFIED if final.passed else Reason.CHECKS_FAILED,
        final.message,
    )
    released = _u(SERVER_READY, "False", Reason.RELEASED, released_message("run finished", external=run.external))
    if final.passed and spec.export is not None:
        return _export(spec, run.observed.export, progress, final.checks, (released, verdict))
    if final.passed:
        succeeded = _u(SUCCEEDED, "True", Reason.COMPLETED, f"{progress.summary}; verification passed")
    else:
        succeeded = _u(SUCCEEDED, "False", final.reason, final.message)
    updates = (released, _u(PROGRESSING, "False", Reason.COMPLETED, progress.summary), verdict, succeeded)
    return run.decision(Step.DONE, failed=not final.passed, updates=updates, checks=final.checks)


def _suspended(run: _Pass) -> Decision | None:
    if not run.observed.suspended:
        return None
    suspended = (
        _u(
            SERVER_READY,
            "False",
            Reason.SUSPENDED,
            f"spec.suspend is true: output kept; the external server keeps running ({EXTERNAL_NOT_OWNED})"
            if run.external
            else "spec.suspend is true: server stopped, GPUs released, output kept",
        ),
        # No count in the words: the workers drain after the transition, and its event must not disagree
        # with the condition's later message (the count moves in status.progress, the PROGRESS column).
        _u(PROGRESSING, "False", Reason.SUSPENDED, "suspended: the workers drain and keep what they wrote"),
        _u(SUCCEEDED, "Unknown", Reason.SUSPENDED, "resume with spec.suspend: false; work continues where it stopped"),
    )
    return run.decision(Step.SUSPENDED, updates=suspended, progress=run.stopped_at)


def _preflight(run: _Pass) -> Decision | None:
    """The preflight: dataset, tokenizer and an existing output, checked before any GPU is asked for."""
    preflight = run.observed.preflight
    if preflight is None and not run.begun:
        checking = (
            _u(
                INPUTS_VERIFIED,
                "Unknown",
                Reason.CHECKING,
                "checking the dataset, tokenizer and output before a server",
            ),
            _u(
                SERVER_READY,
                "False",
                Reason.NOT_STARTED,
                "the external server is probed once the inputs are verified"
                if run.external
                else "the server starts once the inputs are verified",
            ),
            _u(PROGRESSING, "False", Reason.WAITING, "waiting for the preflight"),
            _u(SUCCEEDED, "Unknown", Reason.RUNNING, "preflight running"),
        )
        return run.decision(Step.PREFLIGHT, updates=checking)
    if preflight is None:
        return None
    if not preflight.passed:
        refused = (
            _u(INPUTS_VERIFIED, "False", preflight.reason, preflight.message),
            _u(SERVER_READY, "False", Reason.NOT_STARTED, "no server was started: the inputs failed the preflight"),
            _u(PROGRESSING, "False", Reason.HALTED, "no GPU time was used"),
            _u(SUCCEEDED, "False", Reason.PREFLIGHT_FAILED, preflight.message),
        )
        return run.decision(Step.HALTED, updates=refused, checks=preflight.checks)
    run.updates.append(_u(INPUTS_VERIFIED, "True", preflight.reason, preflight.message))
    if preflight.complete and not run.begun:
        # The output already holds every record: verified from its files, without a server (on GPUs, no
        # model load for nothing) and without a canary.
        run.updates += [
            _u(SERVER_READY, "False", Reason.NOT_NEEDED, "the output is complete: no server was started"),
            _u(PROGRESSING, "True", Reason.VERIFYING, "every record is already in the output; final verification"),
            _u(SUCCEEDED, "Unknown", Reason.VERIFYING, "final verification of the output"),
        ]
        return run.decision(Step.FINAL_VERIFY)
    return None


def _all_shards_done(run: _Pass) -> Decision | None:
    """Every record is written: the final verification reads files only. The server is released and not looked
    at again, so a server that is stopping can never ask for itself back (a model reload)."""
    workers = run.observed.workers
    if workers is None or workers.shards_failed or workers.shards_done < workers.shards_total:
        return None
    run.updates.append(
        _u(SERVER_READY, "False", Reason.RELEASED, released_message("all shards done", external=run.external))
    )
    run.updates += [_u(c, "True" if o.passed else "False", o.reason, o.message) for c, o in _outcomes(run.observed)]
    faithful, checks = _rolling_checks(run.observed, run.context, run.updates)
    if not faithful and run.halt_on_failure:
        return _checks_failed(run, checks, run.progress)
    run.updates += [
        _u(
            PROGRESSING,
            "True",
            Reason.VERIFYING,
            f"all {plural(workers.shards_total, 'shard')} done; final verification",
        ),
        _u(SUCCEEDED, "Unknown", Reason.VERIFYING, "final verification of the output"),
    ]
    return run.decision(Step.FINAL_VERIFY, checks=checks)


def _server(run: _Pass) -> Decision | None:
    server = server_verdict(run.observed.server, run.spec.server.startup_timeout)
    run.updates.append(server.condition)
    if server.fatal:
        run.updates.append(_u(SUCCEEDED, "False", Reason.SERVER_FAILED, server.condition.message))
        return run.decision(Step.HALTED, failed=True, progress=run.stopped_at)
    if server.condition.status == "True":
        return None
    # Workers that already started keep running: they pause by themselves while the server is down (an outage
    # costs no retry: policy.FREE_EXITS), and a server Kueue queued or took back is waited for, never halted on.
    kueue = None
    if server.condition.reason in KUEUE_WAITING:
        kueue = (server.condition.reason, server.condition.message)
    run.updates += _waiting_for(run.observed, "the server", run.started, kueue=kueue)
    return run.decision(Step.WAIT_FOR_SERVER, server_wanted=True, workers_wanted=run.started)


def _parsers(run: _Pass) -> Decision | None:
    """The running server's own word on how it will split reasoning."""
    parsers = run.observed.parsers or _probe_gave_up(run.observed)
    if parsers is None:
        probes = run.observed.parser_probes
        said = "reading /server_info and probing chat completions"
        if probes.count:
            said += f" (attempt {probes.count} of {PARSER_PROBE_ATTEMPTS} failed: {probes.last_error})"
        run.updates.append(_u(PARSERS_VERIFIED, "Unknown", Reason.VERIFYING, said))
        run.updates += _waiting_for(run.observed, "parser verification", run.started, parsers=False)
        return run.decision(Step.VERIFY_PARSERS, server_wanted=True, workers_wanted=run.started)
    run.updates.append(_u(PARSERS_VERIFIED, "True" if parsers.passed else "False", parsers.reason, parsers.message))
    if parsers.passed or not run.halt_on_failure:
        return None
    unread = parsers.reason == Reason.PROBE_FAILED
    why = "the server's parsers could not be read" if unread else "the server's parsers are wrong"
    run.updates += [
        _u(CANARY_PASSED, "Unknown", Reason.NOT_RUN, f"halted before the canary: {why}"),
        _u(PROGRESSING, "False", Reason.HALTED, "no bulk work was started"),
        _u(SUCCEEDED, "False", Reason.PROBE_FAILED if unread else Reason.PARSERS_MISMATCH, parsers.message),
    ]
    return run.decision(Step.HALTED, checks=parsers.checks)


def _canary(run: _Pass) -> Decision | None:
    """Real prompts, raw token checks, before any bulk record."""
    canary = run.observed.canary
    if canary is None:
        prompts = run.spec.checks.canary_prompts
        run.updates += [
            _u(CANARY_PASSED, "Unknown", Reason.RUNNING, f"sending {plural(prompts, 'prompt')} and the probes"),
            _u(DATA_FAITHFUL, "Unknown", Reason.NOT_STARTED, "no records yet"),
            _u(PROGRESSING, "False", Reason.WAITING, "bulk generation starts after the canary passes"),
            _u(SUCCEEDED, "Unknown", Reason.RUNNING, "canary running"),
        ]
        return run.decision(Step.RUN_CANARY, server_wanted=True)
    run.updates.append(_u(CANARY_PASSED, "True" if canary.passed else "False", canary.reason, canary.message))
    if canary.passed or not run.halt_on_failure or run.started:
        return None
    run.updates += [
        _u(PROGRESSING, "False", Reason.HALTED, "no bulk record was written"),
        _u(SUCCEEDED, "False", Reason.CANARY_FAILED, canary.message),
    ]
    return run.decision(Step.HALTED, checks=canary.checks)


def _shard_cause(run: _Pass) -> Decision | None:
    """A shard stopped for a named cause (its output volume is full): said first, in plain words."""
    observed, workers = run.observed, run.observed.workers
    progress = observed.progress
    stopped = (progress.failure_reason if progress else None) or (workers.failure_reason if workers else None)
    lost_now = bool(progress and progress.counts.unwritten)  # this attempt's (stale_events)
    if not stopped or workers is None or not (workers.shards_failed or lost_now):
        return None
    message = (progress.failure_message if progress else None) or workers.failure_message or stopped
    run.updates += [_u(PROGRESSING, "False", stopped, message), _u(SUCCEEDED, "False", stopped, message)]
    return run.decision(Step.HALTED, failed=True, progress=run.stopped_at)


def _bulk(run: _Pass) -> Decision:
    """Bulk generation with rolling checks over the workers' counters."""
    faithful, checks = _rolling_checks(run.observed, run.context, run.updates)
    if not faithful and run.halt_on_failure:
        return _checks_failed(run, checks, run.stopped_at)
    workers = run.observed.workers
    if workers is not None and workers.shards_failed:
        message = workers.failure_message or f"{plural(workers.shards_failed, 'shard')} failed after their retries"
        run.updates += [
            _u(PROGRESSING, "False", Reason.WORKERS_FAILED, message),
            _u(SUCCEEDED, "False", Reason.WORKERS_FAILED, f"{message}; the output is kept and a rerun resumes"),
        ]
        return run.decision(Step.HALTED, failed=True, checks=checks, progress=run.stopped_at)
    summary = run.progress.summary
    run.updates += [_u(PROGRESSING, "True", Reason.RUNNING, summary), _u(SUCCEEDED, "Unknown", Reason.RUNNING, summary)]
    return run.decision(Step.RUN_WORKERS, server_wanted=True, workers_wanted=True, checks=checks)


STEPS: tuple[Callable[[_Pass], Decision | None], ...] = (
    _finished,
    _suspended,
    _preflight,
    _all_shards_done,
    _server,
    _parsers,
    _canary,
    _shard_cause,
    _bulk,
)
"""The run's steps in order: each one decides (a Decision) or lets the run past it (None)."""


def _export(
    spec: DataGenRunSpec,
    export: StepOutcome | None,
    progress: Progress,
    checks: tuple[CheckResult, ...],
    verified: tuple[ConditionUpdate, ...],
) -> Decision:
    """spec.export after a passed verification: the data and its verdict stay whatever the export does."""
    assert spec.export is not None
    formats = ", ".join(spec.export.formats)
    if export is None:
        updates = (
            *verified,
            _u(PROGRESSING, "True", Reason.EXPORTING, f"verification passed; exporting {formats}"),
            _u(EXPORTED, "Unknown", Reason.EXPORTING, f"writing {formats} to {spec.export.path}"),
            _u(SUCCEEDED, "Unknown", Reason.EXPORTING, "verification passed; export running"),
        )
        return Decision(step=Step.EXPORT, updates=updates, checks=checks, progress=progress)
    exported = _u(EXPORTED, "True" if export.passed else "False", export.reason, export.message)
    if export.passed:
        succeeded = _u(SUCCEEDED, "True", Reason.COMPLETED, f"{progress.summary}; verification passed; exported")
    else:
        succeeded = _u(
            SUCCEEDED, "False", Reason.EXPORT_FAILED, f"verification passed; export failed: {export.message}"
        )
    updates = (*verified, _u(PROGRESSING, "False", Reason.COMPLETED, progress.summary), exported, succeeded)
    return Decision(
        step=Step.DONE,
        failed=not export.passed,
        updates=updates,
        checks=checks,
        progress=progress,
    )


def _probe_gave_up(observed: Observed) -> StepOutcome | None:
    """Bounded retries of the parser probe: after PARSER_PROBE_ATTEMPTS failures the failure is the verdict."""
    probes = observed.parser_probes
    if probes.count < PARSER_PROBE_ATTEMPTS:
        return None
    return StepOutcome(
        False,
        Reason.PROBE_FAILED,
        f"the server answers its health checks but its parsers could not be read in {probes.count} attempts: "
        f"{probes.last_error}",
    )


def _outcomes(observed: Observed) -> list[tuple[str, StepOutcome]]:
    """The remembered parser and canary verdicts, to keep reporting once the server is gone."""
    pairs = ((PARSERS_VERIFIED, observed.parsers), (CANARY_PASSED, observed.canary))
    return [(condition, outcome) for condition, outcome in pairs if outcome is not None]


def _checks_failed(run: _Pass, checks: tuple[CheckResult, ...], progress: Progress) -> Decision:
    run.updates += [
        _u(
            PROGRESSING,
            "False",
            Reason.HALTED,
            f"workers paused at {progress.summary}; fix and update the spec to resume",
        ),
        _u(SUCCEEDED, "False", Reason.CHECKS_FAILED, "rolling checks crossed a threshold (see DataFaithful)"),
    ]
    return run.decision(Step.HALTED, checks=checks, progress=progress)


def _rolling_checks(
    observed: Observed, context: CheckContext, updates: list[ConditionUpdate]
) -> tuple[bool, tuple[CheckResult, ...]]:
    """DataFaithful over the records so far (appended to `updates`): (faithful, the checks)."""
    checks: tuple[CheckResult, ...] = ()
    counts = observed.progress.counts if observed.progress else None
    if counts is None or counts.records < MIN_RECORDS_TO_JUDGE:
        have = counts.records if counts else 0
        updates.append(
            _u(
                DATA_FAITHFUL,
                "Unknown",
                Reason.COLLECTING,
                f"{plural(have, 'record')} so far; judging from {MIN_RECORDS_TO_JUDGE}",
            )
        )
        faithful = True
    else:
        checks = tuple(evaluate(counts, context))
        failed = [c for c in checks if not c.passed]
        faithful = not failed
        counted = observed.progress
        # Whole conversations: each rule judges every turn together; where the records are is said turn by turn.
        by_turn = by_turn_words(counted.records_by_turn, counted.flagged_by_turn) if counted else ""
        turns = f"; records by turn: {by_turn}" if by_turn else ""
        if faithful:
            updates.append(
                _u(
                    DATA_FAITHFUL,
                    "True",
                    Reason.WITHIN_THRESHOLDS,
                    f"{plural(len(checks), 'check')} {agrees(len(checks), 'passes', 'pass')} over {plural(counts.records, 'record')}{turns}",
                )
            )
        else:
            updates.append(
                _u(
                    DATA_FAITHFUL,
                    "False",
                    Reason.THRESHOLD_CROSSED,
                    "; ".join(f"{c.name}: {c.verdict}" for c in failed) + turns,
                )
            )
    return faithful, checks


def _waiting_for(
    observed: Observed, what: str, started: bool, parsers: bool = True, kueue: tuple[str, str] | None = None
) -> list[ConditionUpdate]:
    """The conditions of a run waiting for `what`; `kueue`: (reason, message) of a server waiting for Kueue's
    admission (Queued) or re-admission (Preempted, Evicted), in Kueue's words."""
    updates = []
    if parsers and observed.parsers is None:
        updates.append(_u(PARSERS_VERIFIED, "Unknown", Reason.WAITING, f"waiting for {what}"))
    if observed.canary is None:
        updates.append(_u(CANARY_PASSED, "Unknown", Reason.WAITING, f"waiting for {what}"))
    if started and kueue is not None and kueue[0] in KUEUE_TOOK_BACK:
        updates.append(_u(PROGRESSING, "False", kueue[0], f"workers wait for the server: {kueue[1]}"))
    elif started:
        updates.append(_u(PROGRESSING, "True", Reason.PAUSED, f"workers wait for {what}"))
    else:
        updates.append(_u(DATA_FAITHFUL, "Unknown", Reason.NOT_STARTED, "no records yet"))
        if kueue is not None:
            updates.append(_u(PROGRESSING, "False", kueue[0], kueue[1]))
        else:
            updates.append(_u(PROGRESSING, "False", Reason.WAITING, f"waiting for {what}"))
    updates.append(_u(SUCCEEDED, "Unknown", Reason.RUNNING, f"waiting for {what}"))
    return updates
