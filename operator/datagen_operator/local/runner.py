"""The local shell around control.decide: processes instead of pods, the same steps and conditions. Each pass
observes, decides, runs the step due and starts or stops the workers; the server replicas are servers.py's, what
the user sees display.py's."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml

from datagen_operator.api import DataGenRun
from datagen_operator.api.commands import WorkerCommand
from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME, WORKER_GRACE_S
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.status import SUCCEEDED, Condition
from datagen_operator.api.words import plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import CheckContext, check_context
from datagen_operator.control.conditions import apply_updates
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import (
    Observed,
    ProbeFailures,
    ProgressCounters,
    WorkersObservation,
)
from datagen_operator.control.policy import (
    PERMANENT_EXITS,
    SHARD_RETRIES,
    ShardExit,
    shard_exit,
)
from datagen_operator.control.progress import counters_from_snapshots
from datagen_operator.local.display import RunView
from datagen_operator.local.processes import (
    DATAGEN,
    Child,
    forget_processes,
    record_processes,
    stop_leftovers,
)
from datagen_operator.local.servers import LocalServers
from datagen_operator.output.canary_verdict import canary_basis_here, remember_canary, remembered_canary
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import STEP_LOCAL_RUN, STEP_MARGIN_S, Holder, OutputInUse, release_lease, take_lease
from datagen_operator.steps.verify_program import holds_records

if TYPE_CHECKING:
    from datagen_operator.steps.verify import VerifyReport

POLL_S = 0.5

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass
class ShardSlot:
    index: int
    child: Child | None = None
    done: bool = False
    failed: str | None = None
    failure_reason: str | None = None
    retries: int = 0


@dataclass
class LocalRunner:
    run: DataGenRun
    output: Path
    simulator: bool
    sim_args: list[str] = field(default_factory=list)
    console: Any = None
    live: bool = False

    def __post_init__(self) -> None:
        self.spec = self.run.spec
        self.resolved = resolve_model(self.spec)
        self.logs = OutputLayout(self.output).logs
        self.run_file = OutputLayout(self.output).run_file
        self.conditions: list[Condition] = []
        self.servers = LocalServers(
            self.spec, self.resolved, self.simulator, self.sim_args, self.logs, start_child=self._start_child
        )
        self.shards = [ShardSlot(i) for i in range(self.spec.clients.shards)]
        self.preflight: StepOutcome | None = None
        self.parsers: StepOutcome | None = None
        self.parser_probes = ProbeFailures()
        self.canary: StepOutcome | None = None
        self.final: StepOutcome | None = None
        self.final_report: VerifyReport | None = None
        self.export: StepOutcome | None = None
        self.tokenizer: Any = None
        self.stop = asyncio.Event()
        self.decision: Decision | None = None
        self.canary_task: asyncio.Task[StepOutcome] | None = None
        self.started_at = time.time()
        self.holder = Holder.this_process(self.run.metadata.name)
        self.view = RunView(self.run.metadata.name, self.console, self.live)

    # --- the loop ----------------------------------------------------------------------------------

    async def execute(self) -> int:
        from datagen_operator.output.volume import is_volume_error

        self._stop_leftovers()
        try:
            # Before anything is written there: a second run on this output is refused, naming this one.
            take_lease(self.output, self.holder, self.spec.server.startup_timeout + STEP_MARGIN_S, step=STEP_LOCAL_RUN)
        except OutputInUse as busy:
            self.view.say(f"{Reason.OUTPUT_IN_USE}: {busy}", "red")
            return EXIT_FAILED
        except OSError as error:
            if not is_volume_error(error):
                raise
        try:
            self._prepare_output()
        except OSError as error:
            if not is_volume_error(error):
                raise
            self.view.say(
                f"cannot write to {self.output}: {error.strerror}; free space or grow the volume, then rerun", "red"
            )
            return EXIT_FAILED
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        self.session = aiohttp.ClientSession()
        try:
            return await self._loop()
        finally:
            await self._stop_everything()
            await self.session.close()
            forget_processes(self.output)
            release_lease(self.output, self.holder)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _loop(self) -> int:
        context = self._check_context()
        display = self.view.display(self.conditions)
        with display:
            while not self.stop.is_set():
                observed = await self._observe()
                decision = decide(self.spec, observed, context)
                self._record(decision)
                display.update(self.view.renderable(self.conditions, self.decision))
                if decision.finished:
                    break
                await self._act(decision)
                if self.servers.gave_up():
                    self.view.say("the server kept exiting; giving up (see its log)", "red")
                    return EXIT_FAILED
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), POLL_S)
        if self.stop.is_set():
            self.view.say(
                f"interrupted: stopping; rerun `datagen run` with the same manifest to resume ({self.output})", "yellow"
            )
            return EXIT_INTERRUPTED
        return self._finish()

    def _finish(self) -> int:
        from datagen_operator.steps.verify_terminal import render_report

        if self.final_report is not None:
            render_report(self.final_report, self.console)
        succeeded = next((c for c in self.conditions if c.type == SUCCEEDED), None)
        ok = succeeded is not None and succeeded.status == "True"
        verdict = "[bold green]run succeeded[/]" if ok else "[bold red]run did not succeed[/]"
        if holds_records(self.output):
            self.view.say(f"{verdict}: output in {self.output} (datagen verify {self.output})")
        else:  # halted before any record: verify would have nothing to say; the cause is the conditions above
            self.view.say(f"{verdict}: no record was written to {self.output}; the cause is Succeeded's message above")
        return EXIT_SUCCEEDED if ok else EXIT_FAILED

    async def _act(self, decision: Decision) -> None:
        if decision.server_wanted and not self.servers.children and not self.servers.external_urls:
            await self._start_servers()
        if not decision.workers_wanted:
            await self._stop_workers()
        if decision.step is Step.PREFLIGHT:
            self.preflight = await asyncio.to_thread(self._run_preflight)
        elif decision.step is Step.VERIFY_PARSERS:
            await self._verify_parsers()
        elif decision.canary_wanted:
            if self.canary_task is None:
                self.canary_task = asyncio.create_task(self._run_canary())
            self.canary = await self.canary_task
        elif decision.step is Step.RUN_WORKERS:
            # Every external URL (the workers' pool takes one that does not answer out and brings it back).
            await self._supervise_workers(self.servers.external_urls or self.servers.ready_urls())
        elif decision.step is Step.FINAL_VERIFY:
            await self.servers.stop()  # the GPUs are not needed to read files
            self.final = await asyncio.to_thread(self._final_verify)
        elif decision.step is Step.EXPORT:
            self.export = await asyncio.to_thread(self._export)
        if not decision.server_wanted and self.servers.children:
            await self.servers.stop()

    # --- observation -------------------------------------------------------------------------------

    async def _observe(self) -> Observed:
        servers = self.servers
        if servers.external_urls:
            passed = self.preflight is not None and self.preflight.passed
            server = await servers.observe_external(self.session) if passed else None
        else:
            server = await servers.observe(self.session, stopping=self.stop.is_set()) if servers.children else None
        return Observed(
            generation=1,
            preflight=self.preflight,
            server=server,
            parsers=self.parsers,
            parser_probes=self.parser_probes,
            canary=self.canary,
            workers=self._observe_workers(),
            progress=self._observe_progress(),
            final=self.final,
            export=self.export,
        )

    def _observe_workers(self) -> WorkersObservation | None:
        if all(slot.child is None and not slot.done for slot in self.shards):
            return None
        failed = [slot for slot in self.shards if slot.failed]
        return WorkersObservation(
            shards_total=len(self.shards),
            shards_done=sum(slot.done for slot in self.shards),
            shards_failed=len(failed),
            active=sum(1 for slot in self.shards if slot.child is not None and slot.child.running),
            failure_message="; ".join(f"shard {s.index}: {s.failed}" for s in failed) or None,
            failure_reason=next((s.failure_reason for s in failed if s.failure_reason), None),
        )

    def _observe_progress(self) -> ProgressCounters | None:
        from datagen_operator.output.readers import read_progress

        snapshots = read_progress(self.output)
        if not snapshots:
            return None
        # Snapshots from before this `datagen run` are what it resumes from: judged already, not again.
        return counters_from_snapshots(snapshots, attempt_started_at=self.started_at)

    # --- steps -------------------------------------------------------------------------------------

    def _prepare_output(self) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        document = self.run.model_dump(mode="json", by_alias=True, exclude_none=True)
        document.pop("status", None)
        self.run_file.write_text(yaml.safe_dump(document, sort_keys=False))

    def _check_context(self) -> CheckContext:
        return check_context(
            self.resolved, self.spec.checks, rc.expectations_for(self.resolved, self._tokenizer(), ()).think_end_id
        )

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            from datagen_operator.prompts.render import load_tokenizer

            path = self.spec.model.tokenizer_dir
            self.tokenizer = load_tokenizer(path, trust_remote_code=self.resolved.trust_remote_code)
        return self.tokenizer

    async def _start_servers(self) -> None:
        await self.servers.start()
        kind = "the SGLang simulator (no GPU or no sglang here)" if self.simulator else "SGLang"
        self.view.say(
            f"started {plural(self.spec.server.replicas, 'server replica')} with {kind}; logs in {self.logs}", "cyan"
        )

    async def _start_child(self, child: Child) -> None:
        """Start a server or worker and name it in the output's processes.json, for a later run to stop should
        this one be killed without stopping it."""
        await child.start()
        if child.process is None:
            return
        children = [child for child, _ in self.servers.children] + [s.child for s in self.shards if s.child is not None]
        record_processes(self.output, [(c.name, c.process.pid) for c in children if c.process is not None])

    def _stop_leftovers(self) -> None:
        """Children of an earlier `datagen run` of this output that was killed: stopped before this one starts
        (they would generate into the output beside its workers, a server of theirs would hold the GPUs)."""
        stopped = stop_leftovers(self.output)
        if stopped:
            named = ", ".join(f"{child.name} (pid {child.pid})" for child in stopped)
            self.view.say(
                f"stopped {plural(len(stopped), 'process', 'processes')} left running by an earlier datagen run of "
                f"{self.output} that was killed: {named}",
                "yellow",
            )

    def _run_preflight(self) -> StepOutcome:
        from datagen_operator.steps.preflight import run_preflight

        tokenizer_dir = Path(self.spec.model.tokenizer_dir)
        try:
            return run_preflight(
                self.spec, self._tokenizer(), tokenizer_dir, Path(self.spec.dataset.path), self.output, self.holder
            )
        except Exception as error:  # e.g. a tokenizer that does not load: that fails the preflight, with the reason
            return StepOutcome(False, Reason.PREFLIGHT_ERROR, f"{type(error).__name__}: {error}")

    async def _verify_parsers(self) -> None:
        """The server's own word on its parsers; a failed read is counted, and decide() bounds the retries."""
        from datagen_operator.steps.parser_check import verify_running_servers

        urls = self.servers.ready_urls()
        try:
            self.parsers, _ = await verify_running_servers(self.session, urls, self.spec, self.resolved)
        except Exception as error:  # any way of not answering: counted, not a verdict by itself
            self.parser_probes = ProbeFailures(self.parser_probes.count + 1, f"{', '.join(urls)}: {error}")

    async def _run_canary(self) -> StepOutcome:
        from datagen_operator.checks.canary_judgment import without_stale_batch_fill
        from datagen_operator.steps.canary import run_canary

        key = self._canary_key()
        remembered = remembered_canary(self.output, key)
        if remembered is not None:
            self.view.say("canary: passed before on this output with the same fingerprint; not rerun", "cyan")
            return without_stale_batch_fill(remembered, self.spec)
        try:
            outcome = await run_canary(
                self.spec,
                self._tokenizer(),
                Path(self.spec.dataset.path),
                self.servers.ready_urls(),
                record_file=OutputLayout(self.output).canary_records,
            )
        except Exception as error:  # the canary could not even run: that fails it, with the reason
            return StepOutcome(False, Reason.CANARY_ERROR, f"{type(error).__name__}: {error}")
        if outcome.passed:
            remember_canary(self.output, key, outcome)
        return outcome

    def _canary_key(self) -> str:
        """What a canary verdict holds for (api/canary_reuse.py): the same rule as the operator's canary Job."""
        return canary_basis_here(self.spec, Path(self.spec.model.tokenizer_dir), self._tokenizer())

    async def _supervise_workers(self, urls: list[str]) -> None:
        for slot in self.shards:
            if slot.done or slot.failed:
                continue
            child = slot.child
            if child is not None and child.running:
                continue
            if child is not None and child.returncode is not None:
                code = child.returncode
                verdict = shard_exit(code, slot.retries)
                if verdict is ShardExit.DONE:
                    slot.done = True
                    continue
                if code == EXIT_OUTPUT_VOLUME:
                    slot.failure_reason, slot.failed = self._volume_failure(slot.index)
                    continue
                if verdict is ShardExit.FAILED:
                    what = PERMANENT_EXITS.get(code) or f"exit {code} after {SHARD_RETRIES} retries"
                    slot.failed = f"{what}: {child.last_log_line()}"
                    continue
                if verdict is ShardExit.RETRY:
                    slot.retries += 1
            if not urls:
                continue
            argv = self.worker_argv(slot.index, urls)
            slot.child = Child(f"worker-{slot.index}", argv, self.logs / f"worker-{slot.index}.log")
            await self._start_child(slot.child)

    def worker_argv(self, index: int, urls: list[str]) -> list[str]:
        """Shard `index`'s `datagen worker`: on the ready servers, holding the output's lease for this run."""
        command = WorkerCommand(
            run=str(self.run_file),
            output=str(self.output),
            shard_index=index,
            shard_count=len(self.shards),
            servers=tuple(urls),
            lease_holder=self.holder.id,
            concurrency=self.canary.concurrency if self.canary is not None else None,
        )
        return [*DATAGEN, *command.argv()]

    def _volume_failure(self, index: int) -> tuple[str, str]:
        """A worker's exit 7: its cause from its progress.json (written into its freed reserve), else from
        the volume itself (its log sits on the failed volume and may be cut short)."""
        from datagen_operator.output.readers import read_progress
        from datagen_operator.output.volume import free_bytes

        for snapshot in read_progress(self.output):
            if snapshot.shard == index and snapshot.failure_reason:
                return snapshot.failure_reason, snapshot.message
        free = free_bytes(self.output)
        return (
            Reason.OUTPUT_VOLUME_FULL,
            f"the output volume of {self.output} failed ({free} bytes free); free space or grow it, then resume",
        )

    def _final_verify(self) -> StepOutcome:
        from datagen_operator.steps.verify import verify_output

        self.final_report = verify_output(
            self.output, self.spec, tokenizer=self._tokenizer(), dataset=Path(self.spec.dataset.path)
        )
        return self.final_report.outcome()

    def _export(self) -> StepOutcome:
        """spec.export in process: each format to OUTPUT/<export.path>/<format>."""
        from datagen_operator.export.exporter import export_run
        from datagen_operator.export.formats import Selection
        from datagen_operator.export.options import DatasetSource, codec_from_tokenizer
        from datagen_operator.prompts.dataset_ref import DatasetRef
        from datagen_operator.prompts.draws import variable_draws

        spec = self.spec
        export = spec.export
        assert export is not None
        selection = Selection(frozenset(export.exclude_flags), export.max_length)
        return export_run(
            self.output,
            OutputLayout(self.output).export_dir(export.path),
            export.formats,
            selection,
            lambda: codec_from_tokenizer(self._tokenizer()),
            rows=export.rows,
            rerendered_spans=export.rerendered_spans,
            dataset=DatasetSource(DatasetRef.of(spec.dataset), variable_draws(spec.generation.template_variable_mix)),
        )

    async def _stop_workers(self) -> None:
        await asyncio.gather(
            *(s.child.stop(WORKER_GRACE_S) for s in self.shards if s.child is not None and s.child.running)
        )

    async def _stop_everything(self) -> None:
        if self.canary_task is not None and not self.canary_task.done():
            self.canary_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.canary_task
        await self._stop_workers()
        await self.servers.stop()

    # --- what the user sees ------------------------------------------------------------------------

    def _record(self, decision: Decision) -> None:
        before = self.conditions
        self.conditions = apply_updates(before, decision.updates, datetime.now(UTC), 1)
        self.decision = decision
        self.view.show(before, self.conditions, decision)
