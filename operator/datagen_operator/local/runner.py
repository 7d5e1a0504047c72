"""The local shell around control.decide: processes instead of pods, the same steps and conditions."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import yaml

from datagen_operator.api import DataGenRun
from datagen_operator.api.commands import WorkerCommand
from datagen_operator.api.duration import format_duration
from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME, WORKER_GRACE_S
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.status import PROGRESSING, SERVER_READY, SUCCEEDED, Condition
from datagen_operator.api.words import plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import CheckContext, check_context
from datagen_operator.checks.verify import holds_records
from datagen_operator.control.conditions import Event, apply_updates, transition_events
from datagen_operator.control.decide import Decision, Step, decide
from datagen_operator.control.observed import (
    Observed,
    ProbeFailures,
    ProgressCounters,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from datagen_operator.control.policy import (
    PERMANENT_EXITS,
    SHARD_RETRIES,
    ShardExit,
    server_restart_delay_s,
    shard_exit,
)
from datagen_operator.control.progress import counters_from_snapshots, eta_seconds
from datagen_operator.control.server import loading_line_due
from datagen_operator.engine.launch import server_argv
from datagen_operator.local.processes import Child, forget_processes, free_port, record_processes, stop_leftovers
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import STEP_LOCAL_RUN, STEP_MARGIN_S, Holder, OutputInUse, release_lease, take_lease

if TYPE_CHECKING:
    from datagen_operator.checks.verify import VerifyReport

POLL_S = 0.5
PROGRESS_REPORT_S = 5.0
"""How often a log without the live table repeats a changed Progressing message (done/total, tok/s)."""
SERVER_GRACE_S = 15.0

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130

DATAGEN = (sys.executable, "-m", "datagen_operator.cli")
"""How a child runs `datagen`: this interpreter (its environment), whatever `datagen` is on the PATH."""


def gpus_available() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def real_sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None and gpus_available()


@dataclass
class ShardSlot:
    index: int
    child: Child | None = None
    done: bool = False
    failed: str | None = None
    failure_reason: str | None = None
    retries: int = 0


def remembered_canary(output: Path, key: str) -> StepOutcome | None:
    """A passed canary's verdict, beside its records, when it holds for `key` (LocalRunner._canary_key)."""
    try:
        data = orjson.loads(OutputLayout(output).canary_verdict.read_bytes())
        outcome = StepOutcome.from_storage(orjson.dumps(data["outcome"]))
    except (FileNotFoundError, orjson.JSONDecodeError, KeyError, ValueError):
        return None
    if data.get("key") != key or not outcome.passed:
        return None
    return replace(outcome, message=f"passed before with the same fingerprint (not rerun): {outcome.message}")


def remember_canary(output: Path, key: str, outcome: StepOutcome) -> None:
    verdict = OutputLayout(output).canary_verdict
    staging = output / f".{verdict.name}.tmp"
    staging.write_bytes(orjson.dumps({"key": key, "outcome": orjson.loads(outcome.for_storage())}))
    os.replace(staging, verdict)


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
        self.servers: list[tuple[Child, str]] = []
        external = self.spec.server.external
        self.external_urls = [url.rstrip("/") for url in external.urls or ()] if external is not None else []
        """server.external's URLs (`datagen run` takes urls only: main.py refuses a Service): never started here."""
        self.external_ready: list[str] = []
        self.external_unanswered_since: float | None = None
        self.server_exits: dict[int, float] = {}
        """When each server that exited was first seen down (monotonic): its restart waits out the back-off."""
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
        self.started = time.monotonic()
        self.started_at = time.time()
        self.holder = Holder.this_process(self.run.metadata.name)
        self.loading_said_at: float | None = None
        self.progress_said: tuple[float | None, str] = (None, "")
        self.progress_from: tuple[float, int] = (0.0, 0)
        """When the workers began to be counted here, and the records done then: the rate the ETA is read from."""
        """When Progressing's message was last said (its transition event says the first), and what it said."""

    # --- the loop ----------------------------------------------------------------------------------

    async def execute(self) -> int:
        from datagen_operator.output.volume import is_volume_error

        self._stop_leftovers()
        try:
            # Before anything is written there: a second run on this output is refused, naming this one.
            take_lease(self.output, self.holder, self.spec.server.startup_timeout + STEP_MARGIN_S, step=STEP_LOCAL_RUN)
        except OutputInUse as busy:
            self._say(f"{Reason.OUTPUT_IN_USE}: {busy}", "red")
            return EXIT_FAILED
        except OSError as error:
            if not is_volume_error(error):
                raise
        try:
            self._prepare_output()
        except OSError as error:
            if not is_volume_error(error):
                raise
            self._say(
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
        display = self._display()
        with display:
            while not self.stop.is_set():
                observed = await self._observe()
                decision = decide(self.spec, observed, context)
                self._record(decision)
                display.update(self._renderable())
                if decision.finished:
                    break
                await self._act(decision)
                if self._server_gave_up():
                    self._say("the server kept exiting; giving up (see its log)", "red")
                    return EXIT_FAILED
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), POLL_S)
        if self.stop.is_set():
            self._say(
                f"interrupted: stopping; rerun `datagen run` with the same manifest to resume ({self.output})", "yellow"
            )
            return EXIT_INTERRUPTED
        return self._finish()

    def _finish(self) -> int:
        from datagen_operator.checks.verify import render_report

        if self.final_report is not None:
            render_report(self.final_report, self.console)
        succeeded = next((c for c in self.conditions if c.type == SUCCEEDED), None)
        ok = succeeded is not None and succeeded.status == "True"
        verdict = "[bold green]run succeeded[/]" if ok else "[bold red]run did not succeed[/]"
        if holds_records(self.output):
            self._say(f"{verdict}: output in {self.output} (datagen verify {self.output})")
        else:  # halted before any record: verify would have nothing to say; the cause is the conditions above
            self._say(f"{verdict}: no record was written to {self.output}; the cause is Succeeded's message above")
        return EXIT_SUCCEEDED if ok else EXIT_FAILED

    async def _act(self, decision: Decision) -> None:
        if decision.server_wanted and not self.servers and not self.external_urls:
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
            await self._supervise_workers(self.external_urls or self._ready_urls())
        elif decision.step is Step.FINAL_VERIFY:
            await self._stop_servers()  # the GPUs are not needed to read files
            self.final = await asyncio.to_thread(self._final_verify)
        elif decision.step is Step.EXPORT:
            self.export = await asyncio.to_thread(self._export)
        if not decision.server_wanted and self.servers:
            await self._stop_servers()

    # --- observation -------------------------------------------------------------------------------

    async def _observe(self) -> Observed:
        if self.external_urls:
            server = await self._observe_external() if self.preflight is not None and self.preflight.passed else None
        else:
            server = await self._observe_server() if self.servers else None
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

    async def _observe_server(self) -> ServerObservation:
        from datagen_operator.engine.client.reads import is_healthy

        instances = []
        for index, (child, url) in enumerate(self.servers):
            name = f"server-{index}"
            if child.running:
                ready = await is_healthy(self.session, url)
                loading = None if ready else time.monotonic() - child.started_at
                instances.append(
                    ServerInstance(
                        name, running=True, ready=ready, restarts=child.restarts, loading_seconds=loading, endpoint=url
                    )
                )
                continue
            last_exit = f"exit {child.returncode}: {child.last_log_line()}"
            instances.append(
                ServerInstance(name, restarts=child.restarts, last_exit=last_exit, waiting_reason="CrashLoopBackOff")
            )
            delay = server_restart_delay_s(child.restarts)
            exited_at = self.server_exits.setdefault(index, time.monotonic())
            if delay is not None and time.monotonic() - exited_at >= delay and not self.stop.is_set():
                del self.server_exits[index]
                child.restarts += 1
                await self._start_child(child)
        return ServerObservation(self.spec.server.replicas, tuple(instances))

    async def _observe_external(self) -> ServerObservation:
        """server.external: each URL probed; `loading_seconds` counts from when none answered first."""
        from datagen_operator.engine.client.reads import is_healthy

        answers = await asyncio.gather(*(is_healthy(self.session, url) for url in self.external_urls))
        self.external_ready = [url for url, ok in zip(self.external_urls, answers, strict=True) if ok]
        now = time.monotonic()
        if self.external_ready:
            self.external_unanswered_since = None
        elif self.external_unanswered_since is None:
            self.external_unanswered_since = now
        since = self.external_unanswered_since
        waited = None if since is None else now - since
        instances = tuple(
            ServerInstance(url, running=True, ready=ok, loading_seconds=None if ok else waited, endpoint=url)
            for url, ok in zip(self.external_urls, answers, strict=True)
        )
        return ServerObservation(len(instances), instances, external=True)

    def _server_gave_up(self) -> bool:
        return any(not c.running and server_restart_delay_s(c.restarts) is None for c, _ in self.servers)

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

    def _ready_urls(self) -> list[str]:
        if self.external_urls:
            return self.external_ready
        return [url for child, url in self.servers if child.running]

    # --- steps -------------------------------------------------------------------------------------

    def _prepare_output(self) -> None:
        self.output.mkdir(parents=True, exist_ok=True)
        document = self.run.model_dump(mode="json", by_alias=True, exclude_none=True)
        document.pop("status", None)
        self.run_file.write_text(yaml.safe_dump(document, sort_keys=False))

    def _check_context(self) -> CheckContext:
        return check_context(
            self.resolved, self.spec.checks, rc.expectations_for(self.resolved, self._tokenizer(), None).think_end_id
        )

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            from datagen_operator.prompts.render import load_tokenizer

            path = self.spec.model.tokenizer_dir
            self.tokenizer = load_tokenizer(path, trust_remote_code=self.resolved.trust_remote_code)
        return self.tokenizer

    async def _start_servers(self) -> None:
        for index in range(self.spec.server.replicas):
            port = free_port()
            child = Child(f"server-{index}", self.server_argv(port), self.logs / f"server-{index}.log")
            self.servers.append((child, f"http://127.0.0.1:{port}"))
            await self._start_child(child)
        kind = "the SGLang simulator (no GPU or no sglang here)" if self.simulator else "SGLang"
        self._say(
            f"started {plural(self.spec.server.replicas, 'server replica')} with {kind}; logs in {self.logs}", "cyan"
        )

    async def _start_child(self, child: Child) -> None:
        """Start a server or worker and name it in the output's processes.json, for a later run to stop should
        this one be killed without stopping it."""
        await child.start()
        if child.process is None:
            return
        children = [child for child, _ in self.servers] + [s.child for s in self.shards if s.child is not None]
        record_processes(self.output, [(c.name, c.process.pid) for c in children if c.process is not None])

    def _stop_leftovers(self) -> None:
        """Children of an earlier `datagen run` of this output that was killed: stopped before this one starts
        (they would generate into the output beside its workers, a server of theirs would hold the GPUs)."""
        stopped = stop_leftovers(self.output)
        if stopped:
            named = ", ".join(f"{child.name} (pid {child.pid})" for child in stopped)
            self._say(
                f"stopped {plural(len(stopped), 'process', 'processes')} left running by an earlier datagen run of "
                f"{self.output} that was killed: {named}",
                "yellow",
            )

    def _run_preflight(self) -> StepOutcome:
        from datagen_operator.checks.preflight import run_preflight

        tokenizer_dir = Path(self.spec.model.tokenizer_dir)
        try:
            return run_preflight(
                self.spec, self._tokenizer(), tokenizer_dir, Path(self.spec.dataset.path), self.output, self.holder
            )
        except Exception as error:  # e.g. a tokenizer that does not load: that fails the preflight, with the reason
            return StepOutcome(False, Reason.PREFLIGHT_ERROR, f"{type(error).__name__}: {error}")

    async def _verify_parsers(self) -> None:
        """The server's own word on its parsers; a failed read is counted, and decide() bounds the retries."""
        from datagen_operator.checks.server_truth import verify_running_servers

        urls = self._ready_urls()
        try:
            self.parsers, _ = await verify_running_servers(self.session, urls, self.spec, self.resolved)
        except Exception as error:  # any way of not answering: counted, not a verdict by itself
            self.parser_probes = ProbeFailures(self.parser_probes.count + 1, f"{', '.join(urls)}: {error}")

    async def _run_canary(self) -> StepOutcome:
        from datagen_operator.checks.canary import run_canary, without_stale_batch_fill

        key = self._canary_key()
        remembered = remembered_canary(self.output, key)
        if remembered is not None:
            self._say("canary: passed before on this output with the same fingerprint; not rerun", "cyan")
            return without_stale_batch_fill(remembered, self.spec)
        try:
            outcome = await run_canary(
                self.spec,
                self._tokenizer(),
                Path(self.spec.dataset.path),
                self._ready_urls(),
                record_file=OutputLayout(self.output).canary_records,
            )
        except Exception as error:  # the canary could not even run: that fails it, with the reason
            return StepOutcome(False, Reason.CANARY_ERROR, f"{type(error).__name__}: {error}")
        if outcome.passed:
            remember_canary(self.output, key, outcome)
        return outcome

    def _canary_key(self) -> str:
        """What a canary verdict holds for: the spec's data fields and its checks, the tokenizer's files and the
        chat template. A resume with all of them unchanged needs no second canary."""
        from datagen_operator.api.live_fields import LIVE_FIELDS, without_fields
        from datagen_operator.output.fingerprint import chat_template_sha256, tokenizer_fingerprint

        document = self.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        judged = without_fields(document, [path for path in LIVE_FIELDS if path != ("checks",)])
        tokenizer_dir = Path(self.spec.model.tokenizer_dir)
        key = {
            "spec": judged,
            "tokenizer": tokenizer_fingerprint(tokenizer_dir)["sha256"],
            "chat_template": chat_template_sha256(getattr(self._tokenizer(), "chat_template", None)),
        }
        return hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()

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

    def server_argv(self, port: int) -> list[str]:
        """A server replica on 127.0.0.1:`port`: SGLang, or the simulator."""
        argv = server_argv(self.spec, host="127.0.0.1", port=port, python=sys.executable, resolved=self.resolved)
        if self.simulator:
            # The simulator takes sglang.launch_server's own flags: only the program differs.
            argv = [*DATAGEN, "sim-server", *argv[3:], *self.sim_args]
        return argv

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
        from datagen_operator.checks.verify import verify_output

        self.final_report = verify_output(
            self.output, self.spec, tokenizer=self._tokenizer(), dataset=Path(self.spec.dataset.path)
        )
        return self.final_report.outcome()

    def _export(self) -> StepOutcome:
        """spec.export in process: each format to OUTPUT/<export.path>/<format>."""
        from datagen_operator.export.formats import Selection
        from datagen_operator.export.run import DatasetSource, codec_from_tokenizer, export_run
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
            dataset=DatasetSource(
                Path(spec.dataset.path),
                spec.dataset.format,
                spec.dataset.id_field,
                variable_draws(spec.generation.template_variable_mix),
            ),
        )

    async def _stop_workers(self) -> None:
        await asyncio.gather(
            *(s.child.stop(WORKER_GRACE_S) for s in self.shards if s.child is not None and s.child.running)
        )

    async def _stop_servers(self) -> None:
        await asyncio.gather(*(child.stop(SERVER_GRACE_S) for child, _ in self.servers))
        self.servers = []
        self.server_exits.clear()

    async def _stop_everything(self) -> None:
        if self.canary_task is not None and not self.canary_task.done():
            self.canary_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.canary_task
        await self._stop_workers()
        await self._stop_servers()

    # --- what the user sees ------------------------------------------------------------------------

    def _record(self, decision: Decision) -> None:
        before = self.conditions
        self.conditions = apply_updates(before, decision.updates, datetime.now(UTC), 1)
        self.decision = decision
        for event in transition_events(before, self.conditions):
            self._event(event)
        self._repeat_loading()
        self._repeat_progress()

    def _repeat_progress(self) -> None:
        """Without the live table, Progressing's message (done/total, tok/s) would show only its first words
        while the workers run: say it again every PROGRESS_REPORT_S when it changed."""
        progressing = next((c for c in self.conditions if c.type == PROGRESSING), None)
        if self.live or progressing is None or progressing.reason != Reason.RUNNING:
            return
        now = time.monotonic()
        said_at, said = self.progress_said
        progress = self.decision.progress if self.decision is not None else None
        done, total = (progress.records_done, progress.records_total) if progress is not None else (0, 0)
        if said_at is None:  # its transition event has just said it
            self.progress_said = (now, progressing.message)
            self.progress_from = (now, done)
        elif progressing.message != said and now - said_at >= PROGRESS_REPORT_S:
            eta = eta_words(self.progress_from, (now, done), total)
            self._say(f"{progressing.type}={progressing.status} ({progressing.reason}): {progressing.message}{eta}")
            self.progress_said = (now, progressing.message)

    def _repeat_loading(self) -> None:
        """Events show transitions only; without the live table the Loading message would stay at its first
        second for the whole load. Repeat it (its time moved) every LOADING_REPORT_S."""
        ready = next((c for c in self.conditions if c.type == SERVER_READY), None)
        if ready is None or ready.reason != Reason.LOADING:
            self.loading_said_at = None
            return
        now = time.monotonic()
        if self.loading_said_at is None:  # its transition event has just said it
            self.loading_said_at = now
        elif not self.live and loading_line_due(ready.reason, self.loading_said_at, now):
            self._say(f"{ready.type}={ready.status} ({ready.reason}): {ready.message}")
            self.loading_said_at = now

    def _event(self, event: Event) -> None:
        colour = "yellow" if event.type == "Warning" else "white"
        self._say(event.message, colour)

    def _say(self, text: str, colour: str = "white") -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[dim]{elapsed:6.1f}s[/] [{colour}]{text}[/]", highlight=False, soft_wrap=True)

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"DataGenRun {self.run.metadata.name}", expand=True)
        for column in ("condition", "status", "reason", "message"):
            table.add_column(column, overflow="fold", ratio=4 if column == "message" else None)
        for c in self.conditions:
            colour = {"True": "green", "False": "red"}.get(c.status, "yellow")
            table.add_row(c.type, f"[{colour}]{c.status}[/]", c.reason, c.message)
        progress = self.decision.progress if self.decision is not None else None
        if progress is None or not progress.prompts_total:
            return table
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=progress.prompts_total, completed=progress.prompts_done, width=50),
            progress.summary,
            f"shards {progress.shards_done}/{progress.shards_total}",
        )
        return Group(table, bar)

    def _display(self) -> Any:
        if self.live:
            from rich.live import Live

            return Live(self._renderable(), console=self.console, refresh_per_second=4, transient=True)
        return _NoDisplay()


def eta_words(start: tuple[float, int], now: tuple[float, int], total: int) -> str:
    """', ETA 3m20s' at the rate records were done since `start` ((monotonic s, records done)), or '' before any
    (control/progress `eta_seconds`: the operator's status.progress.eta is read by the same rule)."""
    seconds = eta_seconds(start, now, total)
    return "" if seconds is None else f", ETA {format_duration(seconds)}"


class _NoDisplay:
    """Without a terminal the events are the display."""

    def __enter__(self) -> _NoDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: Any) -> None:
        return None
