"""The run's state machine: one pure function from (spec, observed) to conditions and the next step.

The operator and the local runner both call `decide` on every pass and only differ in how they carry out
the step (pods and Jobs vs processes). Steps run in order, each gated on the one before:
inputs verified (preflight) -> server ready -> parsers verified -> canary passed -> workers -> final verification
-> export (only with spec.export) -> done.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from functools import partial

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
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
from datagen_operator.checks.evaluate import MIN_RECORDS_TO_JUDGE, CheckContext, by_turn_words, evaluate
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.observed import Observed, ProgressCounters
from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS
from datagen_operator.control.server import server_verdict


class Step(StrEnum):
    INVALID = "Invalid"
    SUSPENDED = "Suspended"
    PREFLIGHT = "Preflight"
    WAIT_FOR_SERVER = "WaitForServer"
    VERIFY_PARSERS = "VerifyParsers"
    RUN_CANARY = "RunCanary"
    RUN_WORKERS = "RunWorkers"
    FINAL_VERIFY = "FinalVerify"
    EXPORT = "Export"
    HALTED = "Halted"
    DONE = "Done"


@dataclass(frozen=True, kw_only=True)
class Decision:
    step: Step
    phase: str
    server_wanted: bool = False
    """Keep the server (and its GPUs); False releases them."""
    workers_wanted: bool = False
    """Workers should be running now (False: not started yet, paused, or finished)."""
    updates: tuple[ConditionUpdate, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    progress: Progress | None = None

    @property
    def canary_wanted(self) -> bool:
        """The canary starts once the parsers are verified, never alongside: a run halted on its parsers
        sends no canary prompt (CanaryPassed reads NotRun)."""
        return self.step is Step.RUN_CANARY

    @property
    def finished(self) -> bool:
        """Nothing more happens for this spec: the shells stop passing (local) or only report (operator)."""
        return self.step in (Step.DONE, Step.HALTED, Step.INVALID)


def _u(type_: str, status: ConditionStatus, reason: str, message: str = "") -> ConditionUpdate:
    return ConditionUpdate(type_, status, reason, message)


def human_rate(tokens_per_second: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_second >= scale:
            return f"{tokens_per_second / scale:.1f}{unit}"
    return f"{tokens_per_second:.0f}"


def progress_of(
    counters: ProgressCounters | None,
    shards_total: int,
    shards_done: int,
    *,
    dataset_prompts: int | None = None,
    dataset_turns: int | None = None,
    samples: int = 1,
    uncounted: str = "workers starting",
    rate: bool = True,
) -> Progress:
    """The run's progress over its whole output; `uncounted` is the summary while no total is known, `rate`
    False for a run that stops now (halted, suspended): the last rate is no longer anyone's.

    The total is the preflight's count of the dataset (`dataset_prompts`) from the start: the workers' sum
    grows as they read the dataset, so it stands in only where no preflight counted. Done is counted in
    samples over the whole output (recorded, refused by the server, set aside), which a resumed worker reads
    from disk before it reads the dataset again: it never goes backwards. The workers' per-prompt count starts
    over on a resume, so it is shown only where no preflight counted. Whole conversations (`dataset_turns`, the
    preflight's count of their planned turns) are counted in turns, their conversations beside them."""
    c = counters or ProgressCounters()
    conversations = dataset_turns is not None
    if dataset_prompts is None:
        prompts_total, prompts_done = c.prompts_total, c.prompts_done
        records_total = prompts_total * samples
        records_done = c.tally.records + c.tally.rejected + c.records_set_aside
    else:
        prompts_total, records_total = dataset_prompts, (dataset_turns or dataset_prompts) * samples
        # A prompt set aside after some of its samples were recorded counts each once: never past the total.
        records_done = min(records_total, c.tally.records + c.tally.rejected + c.records_set_aside)
        # One answer a prompt: a prompt is done when its sample is. More: the workers' count, for the status only.
        single = samples == 1 and not conversations
        prompts_done = records_done if single else min(prompts_total, c.prompts_done)
    if conversations and records_total:
        done, total, unit = records_done, records_total, "turns" if samples == 1 else "records"
    elif dataset_prompts is None or samples == 1:
        done, total, unit = prompts_done, prompts_total, "prompts"
    else:
        done, total, unit = records_done, records_total, "records"
    summary = f"{done}/{total} {unit}"
    if conversations and total:
        summary += f" ({prompts_done}/{prompts_total} conversations)"
    producing = counters is not None and done < total
    if rate and (producing or c.tokens_per_second):  # a finished run (or one not generating yet) has none
        summary += f", {human_rate(c.tokens_per_second)} tok/s"
    if not total:
        summary = uncounted
    if c.tally.rejected or c.malformed:
        summary += f", {c.tally.rejected + c.malformed} set aside"
    return Progress(
        prompts_total=prompts_total,
        prompts_done=prompts_done,
        records_total=records_total,
        records_done=records_done,
        records=c.tally.records,
        dataset_prompts=dataset_prompts,
        dataset_turns=dataset_turns,
        completion_tokens=c.completion_tokens,
        tokens_per_second=round(c.tokens_per_second, 1),
        shards_total=shards_total,
        shards_done=shards_done,
        rejected=c.tally.rejected + c.malformed,
        summary=summary,
    )


def _uncounted(observed: Observed, begun: bool) -> str:
    """The Progress column before any total is known: what the run is doing instead, never a step it is not at."""
    preflight = observed.preflight
    if observed.workers is not None:
        return "workers starting"
    if preflight is None:
        return "waiting for the workers' count" if begun else "preflight running"
    if not preflight.passed:
        return "halted at the preflight"
    return "waiting for the workers' count"  # a passed preflight whose count is not at hand


def decide(spec: DataGenRunSpec | None, observed: Observed, context: CheckContext | None) -> Decision:
    """`spec` and `context` are None when the spec does not parse (then `observed.spec_error` says why)."""
    if observed.spec_error is not None or spec is None or context is None:
        message = observed.spec_error or "the spec did not parse"
        return Decision(
            step=Step.INVALID, phase="Invalid", updates=(_u(SUCCEEDED, "False", Reason.INVALID_SPEC, message),)
        )
    if observed.halted is not None:
        # A halt stands until the spec changes: nothing is asked for again (not even the server).
        halted = observed.halted
        return Decision(step=Step.HALTED, phase=halted.phase, checks=halted.checks, progress=halted.progress)
    return _server_released_reads_false(_verdicts_recorded(_decide(spec, observed, context), observed))


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


def _server_released_reads_false(decision: Decision) -> Decision:
    """One rule for every step that releases the server (halts, the end, final verification): ServerReady
    cannot stay True over a server that is being scaled to zero, whatever the last look at it said."""
    if decision.server_wanted:
        return decision
    why = {Step.FINAL_VERIFY: "all shards done", Step.EXPORT: "run finished", Step.DONE: "run finished"}.get(
        decision.step, "run halted"
    )
    released = _u(SERVER_READY, "False", Reason.RELEASED, f"{why}; server stopped and GPUs released")
    updates = tuple(released if u.type == SERVER_READY and u.status == "True" else u for u in decision.updates)
    return replace(decision, updates=updates)


def _decide(spec: DataGenRunSpec, observed: Observed, context: CheckContext) -> Decision:
    halt_on_failure = spec.checks.on_failure == "Halt"
    shards = spec.clients.shards
    workers = observed.workers
    started = workers is not None
    # The preflight: dataset, tokenizer and an existing output, checked before any GPU is asked for. A run
    # that got further (a server, a gate verdict or workers observed) with no preflight verdict at hand is not
    # sent back to it.
    begun = observed.parsers is not None or observed.canary is not None or started
    begun = begun or bool(observed.server and observed.server.instances)
    preflight = observed.preflight
    counted = partial(
        progress_of,
        observed.progress,
        shards,
        workers.shards_done if workers else 0,
        dataset_prompts=preflight.prompts if preflight is not None and preflight.passed else None,
        dataset_turns=preflight.turns if preflight is not None and preflight.passed else None,
        samples=spec.generation.samples_per_prompt,
        uncounted=_uncounted(observed, begun),
    )
    progress, stopped_at = counted(), counted(rate=False)
    if preflight is not None and preflight.passed and preflight.complete:
        progress = stopped_at = _complete(progress)

    # A finished run stays finished: its verdict is final and the GPUs are released.
    if observed.final is not None:
        final = observed.final
        verdict = _u(
            DATA_FAITHFUL,
            "True" if final.passed else "False",
            Reason.VERIFIED if final.passed else Reason.CHECKS_FAILED,
            final.message,
        )
        released = _u(SERVER_READY, "False", Reason.RELEASED, "run finished; server stopped and GPUs released")
        if final.passed and spec.export is not None:
            return _export(spec, observed.export, progress, final.checks, (released, verdict))
        if final.passed:
            succeeded = _u(SUCCEEDED, "True", Reason.COMPLETED, f"{progress.summary}; verification passed")
        else:
            succeeded = _u(SUCCEEDED, "False", final.reason, final.message)
        return Decision(
            step=Step.DONE,
            phase="Succeeded" if final.passed else "Failed",
            updates=(released, _u(PROGRESSING, "False", Reason.COMPLETED, progress.summary), verdict, succeeded),
            checks=final.checks,
            progress=progress,
        )

    if observed.suspended:
        suspended = (
            _u(
                SERVER_READY,
                "False",
                Reason.SUSPENDED,
                "spec.suspend is true: server stopped, GPUs released, output kept",
            ),
            # No count in the words: the workers drain after the transition, and its event must not disagree
            # with the condition's later message (the count moves in status.progress, the PROGRESS column).
            _u(PROGRESSING, "False", Reason.SUSPENDED, "suspended: the workers drain and keep what they wrote"),
            _u(
                SUCCEEDED,
                "Unknown",
                Reason.SUSPENDED,
                "resume with spec.suspend: false; work continues where it stopped",
            ),
        )
        return Decision(step=Step.SUSPENDED, phase="Suspended", updates=suspended, progress=stopped_at)

    if preflight is None and not begun:
        checking = (
            _u(
                INPUTS_VERIFIED,
                "Unknown",
                Reason.CHECKING,
                "checking the dataset, tokenizer and output before a server",
            ),
            _u(SERVER_READY, "False", Reason.NOT_STARTED, "the server starts once the inputs are verified"),
            _u(PROGRESSING, "False", Reason.WAITING, "waiting for the preflight"),
            _u(SUCCEEDED, "Unknown", Reason.RUNNING, "preflight running"),
        )
        return Decision(step=Step.PREFLIGHT, phase="Preflight", updates=checking, progress=progress)
    if preflight is not None and not preflight.passed:
        refused = (
            _u(INPUTS_VERIFIED, "False", preflight.reason, preflight.message),
            _u(SERVER_READY, "False", Reason.NOT_STARTED, "no server was started: the inputs failed the preflight"),
            _u(PROGRESSING, "False", Reason.HALTED, "no GPU time was used"),
            _u(SUCCEEDED, "False", Reason.PREFLIGHT_FAILED, preflight.message),
        )
        return Decision(step=Step.HALTED, phase="Halted", updates=refused, checks=preflight.checks, progress=progress)

    updates: list[ConditionUpdate] = []
    if preflight is not None:
        updates.append(_u(INPUTS_VERIFIED, "True", preflight.reason, preflight.message))
    if preflight is not None and preflight.complete and not begun:
        # The output already holds every record: verified from its files, without a server (on GPUs, no
        # model load for nothing) and without a canary.
        updates.append(_u(SERVER_READY, "False", Reason.NOT_NEEDED, "the output is complete: no server was started"))
        updates.append(
            _u(PROGRESSING, "True", Reason.VERIFYING, "every record is already in the output; final verification")
        )
        updates.append(_u(SUCCEEDED, "Unknown", Reason.VERIFYING, "final verification of the output"))
        return Decision(step=Step.FINAL_VERIFY, phase="Verifying", updates=tuple(updates), progress=progress)
    if workers is not None and not workers.shards_failed and workers.shards_done >= workers.shards_total:
        # Every record is written: the final verification reads files only. The server is released and not
        # looked at again, so a server that is stopping can never ask for itself back (a model reload).
        updates.append(_u(SERVER_READY, "False", Reason.RELEASED, "all shards done; server stopped and GPUs released"))
        updates += [_u(c, "True" if o.passed else "False", o.reason, o.message) for c, o in _outcomes(observed)]
        return _final_verify(observed, context, halt_on_failure, progress, updates)

    server = server_verdict(observed.server, spec.server.startup_timeout)
    updates.append(server.condition)
    if server.fatal:
        updates.append(_u(SUCCEEDED, "False", Reason.SERVER_FAILED, server.condition.message))
        return Decision(step=Step.HALTED, phase="Failed", updates=tuple(updates), progress=stopped_at)
    if server.condition.status != "True":
        # Workers that already started keep running: they pause by themselves while the server is down.
        updates += _waiting_for(observed, "the server", started)
        return Decision(
            step=Step.WAIT_FOR_SERVER,
            phase="Starting" if not started else "Running",
            server_wanted=True,
            workers_wanted=started,
            updates=tuple(updates),
            progress=progress,
        )

    # Parsers: the running server's own word on how it will split reasoning.
    parsers_seen = observed.parsers or _probe_gave_up(observed)
    if parsers_seen is None:
        probes = observed.parser_probes
        said = "reading /server_info and probing chat completions"
        if probes.count:
            said += f" (attempt {probes.count} of {PARSER_PROBE_ATTEMPTS} failed: {probes.last_error})"
        updates.append(_u(PARSERS_VERIFIED, "Unknown", Reason.VERIFYING, said))
        updates += _waiting_for(observed, "parser verification", started, parsers=False)
        return Decision(
            step=Step.VERIFY_PARSERS,
            phase="Verifying",
            server_wanted=True,
            workers_wanted=started,
            updates=tuple(updates),
            progress=progress,
        )
    parsers = parsers_seen
    updates.append(_u(PARSERS_VERIFIED, "True" if parsers.passed else "False", parsers.reason, parsers.message))
    if not parsers.passed and halt_on_failure:
        unread = parsers.reason == Reason.PROBE_FAILED
        why = "the server's parsers could not be read" if unread else "the server's parsers are wrong"
        updates.append(_u(CANARY_PASSED, "Unknown", Reason.NOT_RUN, f"halted before the canary: {why}"))
        updates.append(_u(PROGRESSING, "False", Reason.HALTED, "no bulk work was started"))
        updates.append(
            _u(SUCCEEDED, "False", Reason.PROBE_FAILED if unread else Reason.PARSERS_MISMATCH, parsers.message)
        )
        return Decision(
            step=Step.HALTED, phase="Halted", updates=tuple(updates), checks=parsers.checks, progress=progress
        )

    # The canary: real prompts, raw token checks, before any bulk record.
    if observed.canary is None:
        updates.append(
            _u(CANARY_PASSED, "Unknown", Reason.RUNNING, f"sending {spec.checks.canary_prompts} prompts and the probes")
        )
        updates.append(_u(DATA_FAITHFUL, "Unknown", Reason.NOT_STARTED, "no records yet"))
        updates.append(_u(PROGRESSING, "False", Reason.WAITING, "bulk generation starts after the canary passes"))
        updates.append(_u(SUCCEEDED, "Unknown", Reason.RUNNING, "canary running"))
        return Decision(
            step=Step.RUN_CANARY, phase="Canary", server_wanted=True, updates=tuple(updates), progress=progress
        )
    canary = observed.canary
    updates.append(_u(CANARY_PASSED, "True" if canary.passed else "False", canary.reason, canary.message))
    if not canary.passed and halt_on_failure and not started:
        updates.append(_u(PROGRESSING, "False", Reason.HALTED, "no bulk record was written"))
        updates.append(_u(SUCCEEDED, "False", Reason.CANARY_FAILED, canary.message))
        return Decision(
            step=Step.HALTED, phase="Halted", updates=tuple(updates), checks=canary.checks, progress=progress
        )

    # A shard stopped for a named cause (its output volume is full): said first, in plain words.
    stopped = (observed.progress.failure_reason if observed.progress else None) or (
        workers.failure_reason if workers else None
    )
    lost_now = bool(observed.progress and observed.progress.tally.unwritten)  # this attempt's (stale_events)
    if stopped and workers is not None and (workers.shards_failed or lost_now):
        message = (observed.progress.failure_message if observed.progress else None) or workers.failure_message
        updates.append(_u(PROGRESSING, "False", stopped, message or stopped))
        updates.append(_u(SUCCEEDED, "False", stopped, message or stopped))
        return Decision(step=Step.HALTED, phase="Failed", updates=tuple(updates), progress=stopped_at)

    # Bulk generation with rolling checks over the workers' counters.
    faithful, checks = _rolling_checks(observed, context, updates)
    if not faithful and halt_on_failure:
        return _checks_failed(stopped_at, updates, checks)

    if workers is not None and workers.shards_failed:
        message = workers.failure_message or f"{workers.shards_failed} shard(s) failed after their retries"
        updates.append(_u(PROGRESSING, "False", Reason.WORKERS_FAILED, message))
        updates.append(
            _u(SUCCEEDED, "False", Reason.WORKERS_FAILED, f"{message}; the output is kept and a rerun resumes")
        )
        return Decision(step=Step.HALTED, phase="Failed", updates=tuple(updates), checks=checks, progress=stopped_at)
    updates.append(_u(PROGRESSING, "True", Reason.RUNNING, progress.summary))
    updates.append(_u(SUCCEEDED, "Unknown", Reason.RUNNING, progress.summary))
    return Decision(
        step=Step.RUN_WORKERS,
        phase="Running",
        server_wanted=True,
        workers_wanted=True,
        updates=tuple(updates),
        checks=checks,
        progress=progress,
    )


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
        return Decision(step=Step.EXPORT, phase="Exporting", updates=updates, checks=checks, progress=progress)
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
        phase="Succeeded" if export.passed else "Failed",
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


def _complete(progress: Progress) -> Progress:
    """A run over a complete output: every sample is done (what the preflight read from its manifest), whether
    or not this run's own workers ever counted them (they never ran)."""
    samples = progress.records_total // progress.prompts_total if progress.prompts_total else 1
    done, total, unit = (
        (progress.prompts_total, progress.prompts_total, "prompts")
        if samples == 1
        else (progress.records_total, progress.records_total, "records")
    )
    return progress.model_copy(
        update={
            "prompts_done": progress.prompts_total,
            "records_done": progress.records_total,
            "summary": f"{done}/{total} {unit}",
        }
    )


def _final_verify(
    observed: Observed, context: CheckContext, halt_on_failure: bool, progress: Progress, updates: list[ConditionUpdate]
) -> Decision:
    faithful, checks = _rolling_checks(observed, context, updates)
    if not faithful and halt_on_failure:
        return _checks_failed(progress, updates, checks)
    total = observed.workers.shards_total if observed.workers else 0
    updates.append(_u(PROGRESSING, "True", Reason.VERIFYING, f"all {total} shards done; final verification"))
    updates.append(_u(SUCCEEDED, "Unknown", Reason.VERIFYING, "final verification of the output"))
    return Decision(step=Step.FINAL_VERIFY, phase="Verifying", updates=tuple(updates), checks=checks, progress=progress)


def _checks_failed(progress: Progress, updates: list[ConditionUpdate], checks: tuple[CheckResult, ...]) -> Decision:
    updates.append(
        _u(
            PROGRESSING,
            "False",
            Reason.HALTED,
            f"workers paused at {progress.summary}; fix and update the spec to resume",
        )
    )
    updates.append(
        _u(SUCCEEDED, "False", Reason.CHECKS_FAILED, "rolling checks crossed a threshold (see DataFaithful)")
    )
    return Decision(step=Step.HALTED, phase="Halted", updates=tuple(updates), checks=checks, progress=progress)


def _rolling_checks(
    observed: Observed, context: CheckContext, updates: list[ConditionUpdate]
) -> tuple[bool, tuple[CheckResult, ...]]:
    """DataFaithful over the records so far (appended to `updates`): (faithful, the checks)."""
    checks: tuple[CheckResult, ...] = ()
    tally = observed.progress.tally if observed.progress else None
    if tally is None or tally.records < MIN_RECORDS_TO_JUDGE:
        have = tally.records if tally else 0
        updates.append(
            _u(
                DATA_FAITHFUL,
                "Unknown",
                Reason.COLLECTING,
                f"{have} records so far; judging from {MIN_RECORDS_TO_JUDGE}",
            )
        )
        faithful = True
    else:
        checks = tuple(evaluate(tally, context))
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
                    f"{len(checks)} checks pass over {tally.records} records{turns}",
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


def _waiting_for(observed: Observed, what: str, started: bool, parsers: bool = True) -> list[ConditionUpdate]:
    updates = []
    if parsers and observed.parsers is None:
        updates.append(_u(PARSERS_VERIFIED, "Unknown", Reason.WAITING, f"waiting for {what}"))
    if observed.canary is None:
        updates.append(_u(CANARY_PASSED, "Unknown", Reason.WAITING, f"waiting for {what}"))
    if started:
        updates.append(_u(PROGRESSING, "True", Reason.PAUSED, f"workers wait for {what}"))
    else:
        updates.append(_u(DATA_FAITHFUL, "Unknown", Reason.NOT_STARTED, "no records yet"))
        updates.append(_u(PROGRESSING, "False", Reason.WAITING, f"waiting for {what}"))
    updates.append(_u(SUCCEEDED, "Unknown", Reason.RUNNING, f"waiting for {what}"))
    return updates
