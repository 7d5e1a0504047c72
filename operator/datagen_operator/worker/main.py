"""`datagen worker`: generate one shard of a run. What the client Job pods and the local runner execute.

Exit codes: api/exit_codes.py (docs/worker.md explains each).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import orjson

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_OUTPUT_VOLUME,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.api.progress import RecordCounts, ShardProgress
from datagen_operator.checks.record_checks import inspect_record
from datagen_operator.engine.client.generate import GenerateClient, Reply
from datagen_operator.engine.client.policy import (
    Drained,
    EndpointsRejected,
    GaveUp,
    Rejected,
    RetryPolicy,
    ServerUnreachable,
)
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.engine.client.reads import make_session
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.parquet import CompactionResult
from datagen_operator.output.records import (
    TOO_LONG,
    UNRENDERABLE,
    Answer,
    ContextLimit,
    Job,
    build_record,
    context_limit,
    encode_record,
    generate_payload,
    malformed_reject,
    server_reject,
    too_long_reason,
    too_long_reject,
)
from datagen_operator.output.writer import ShardWriter
from datagen_operator.worker.config import (
    BadInput,
    FingerprintMismatch,
    WorkerConfig,
    build_parser,
    config_from_args,
    setup_logging,
)
from datagen_operator.worker.inputs import Inputs
from datagen_operator.worker.progress import Sinks, Tracker
from datagen_operator.worker.servers import Stopped, server_infos, verifier
from datagen_operator.worker.shard_files import claim_output, keep_run_file, record_shard

log = logging.getLogger("datagen.worker")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format)
    try:
        config = config_from_args(args, dict(os.environ))
    except BadInput as error:
        log.error("%s", error)
        return EXIT_BAD_INPUT
    return asyncio.run(Worker(config).run())


# --- the worker ------------------------------------------------------------------------------------


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.stop_new = asyncio.Event()  # SIGTERM: no new requests
        self.fatal: tuple[int, str] | None = None
        self.drained = False
        self.abandon = asyncio.Event()  # a second SIGTERM/SIGINT: stop waiting for requests in flight
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=2 * config.spec.clients.concurrency)
        self.volume_error: OSError | None = None
        self.unwritten = 0
        """Answers that reached this worker but not the volume (buffered at the failure, or arriving after)."""
        self.progress = ShardProgress(shard=config.shard_index, shard_count=config.shard_count, started_at=time.time())
        self.layout = OutputLayout(config.output)
        self.samples = config.spec.generation.samples_per_prompt
        # Set as the worker gets that far: inputs, then servers, then the shard's files, then generation.
        self._inputs: Inputs | None = None
        self._pool: EndpointPool | None = None
        self.server_fp: dict[str, Any] | None = None
        self._context_limit: ContextLimit | None = None
        self._writer: ShardWriter | None = None
        self.tracker = Tracker(self.progress)
        self._client: GenerateClient | None = None
        self.remaining: dict[str, int] = {}
        """Samples left per prompt id of the plan read so far."""
        self.planned = False
        """True once the feeder has read the whole plan (the totals are final)."""
        self._sinks: Sinks | None = None
        self.compaction: CompactionResult | None = None

    @property
    def inputs(self) -> Inputs:
        assert self._inputs is not None, "the inputs load first"
        return self._inputs

    @property
    def pool(self) -> EndpointPool:
        assert self._pool is not None, "the servers are met before generation"
        return self._pool

    @property
    def writer(self) -> ShardWriter:
        assert self._writer is not None, "the shard files are claimed before generation"
        return self._writer

    @property
    def client(self) -> GenerateClient:
        assert self._client is not None, "the client is built with the shard files"
        return self._client

    @property
    def sinks(self) -> Sinks:
        assert self._sinks is not None, "the progress sinks are set up before generation"
        return self._sinks

    @property
    def context_limit(self) -> ContextLimit:
        assert self._context_limit is not None, "the servers are met before generation"
        return self._context_limit

    async def run(self) -> int:
        try:
            return await self._run()
        except BadInput as error:
            log.error("%s", error)
            return self._fail(EXIT_BAD_INPUT, str(error))
        except FingerprintMismatch as error:
            log.error("%s", error)
            return self._fail(EXIT_FINGERPRINT_MISMATCH, str(error))
        except OSError as error:
            from datagen_operator.output.volume import is_volume_error, volume_reason

            if not is_volume_error(error):
                raise
            # Failed before generation (the manifest, the reserve): nothing was generated.
            message, reason = self._volume_text(error), volume_reason(error)
            return self._fail(EXIT_OUTPUT_VOLUME, message, reason)

    def _volume_text(self, error: OSError, free: int | None = None) -> str:
        from datagen_operator.output.volume import free_bytes, volume_failure_text, volume_reason

        p, output = self.progress, self.config.output
        reason = volume_reason(error)
        free = free_bytes(output) if free is None else free
        text = volume_failure_text(reason, output, free, p.records_done, p.records_total, error.strerror or str(error))
        return f"{reason}: {text}"

    def _fail(self, code: int, message: str, reason: str = "") -> int:
        from datagen_operator.output.layout import OutputLayout
        from datagen_operator.worker.progress import FileSink

        self._tell_cause(message)
        layout = OutputLayout(self.config.output)
        path = layout.progress(self.config.shard_index)
        if layout.shard_dir(self.config.shard_index).is_dir():
            # Before generation the counters are not loaded: keep the last run's, change only the state.
            snapshot = self.progress
            if self.progress.records_total == 0 and path.exists():
                with contextlib.suppress(orjson.JSONDecodeError, TypeError, OSError):
                    snapshot = ShardProgress.from_storage(path.read_bytes())
            snapshot.state, snapshot.message, snapshot.in_flight = "failed", message, 0
            snapshot.failure_reason = reason
            snapshot.updated_at = time.time()
            try:
                FileSink(path).write(snapshot)
            except OSError as error:
                log.error("cannot write %s: %s", path, error)
        return code

    def _tell_cause(self, message: str) -> None:
        """The failure's cause where a failing output volume cannot hide it: stderr (one plain line, before
        any log handler that may write to that volume) and the termination message."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"datagen worker shard {self.config.shard_index}: {message}\n")
            sys.stderr.flush()
        if self.config.termination_log is not None:
            with contextlib.suppress(OSError):
                self.config.termination_log.write_text(message[-4000:])  # the kubelet keeps 4096 bytes

    async def _run(self) -> int:
        from datagen_operator.worker.inputs import load_inputs

        c = self.config
        self._inputs = inputs = await load_inputs(c)
        session = make_session(c.spec.clients.concurrency, len(c.servers))
        try:
            return await self._with_session(session, inputs.tokenizer)
        finally:
            await session.close()
            inputs.render_pool.close()

    async def _with_session(self, session: Any, tokenizer: Any) -> int:
        from datagen_operator.output.fingerprint import (
            build_fingerprint,
            chat_template_sha256,
            fingerprint_sha256,
            server_fingerprint,
            tokenizer_fingerprint,
        )
        from datagen_operator.output.writer import ShardWriter, remove_stale_temporaries

        c = self.config
        pool = EndpointPool(
            c.servers,
            session,
            unreachable_after_s=c.server_timeout_s,
            verify=verifier(session, lambda: self.server_fp),
            stop=None,
        )
        self._pool = pool
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_drain, sig)
        try:
            infos = await server_infos(session, pool, c.server_timeout_s, self.stop_new)
        except ServerUnreachable as error:
            log.error("%s", error)
            return self._fail(EXIT_SERVER_UNREACHABLE, str(error))
        except Stopped:
            return self._fail(EXIT_DRAINED, "stopped before any server answered")
        prints = {url: server_fingerprint(info) for url, info in infos.items()}
        first_url, first = next(iter(prints.items()))
        for url, other in prints.items():
            if other != first:
                from datagen_operator.output.fingerprint import diff_fingerprints

                changes = "; ".join(diff_fingerprints(first, other))
                raise FingerprintMismatch(f"servers {first_url} and {url} differ: {changes}")
        self.server_fp = first
        self._context_limit = context_limit(infos.values())
        log.info(
            "server context: %s tokens (prompt + max_new_tokens), inputs under %s tokens",
            self.context_limit.context_length or "unknown",
            self.context_limit.max_input or "unknown",
        )
        stream = bool(c.spec.generation.stream)
        if stream and not infos[first_url].get("incremental_streaming_output", False):
            log.warning(
                "generation.stream is on but %s streams cumulative output_ids (O(n^2) bytes); "
                "not streaming. Start SGLang with --incremental-streaming-output to stream.",
                first_url,
            )
            stream = False

        fingerprint = build_fingerprint(
            tokenizer=tokenizer_fingerprint(c.tokenizer_dir),
            chat_template=chat_template_sha256(self.inputs.renderer.chat_template),
            server=first,
            sampling=self.inputs.sampling,
            preset=c.resolved.preset.name if c.resolved.preset else None,
            thinking=c.resolved.thinking,
        )
        removed = remove_stale_temporaries(self.layout, c.shard_index)
        if removed:
            log.info("removed %d temporary files an earlier run left behind", removed)
        self.progress.fingerprint_sha256 = fingerprint_sha256(fingerprint)  # shown even when the claim fails
        claim_output(self.layout, c, fingerprint)
        keep_run_file(c)

        writer = ShardWriter(self.layout, c.shard_index)
        # The compacted Parquet counts as recorded even in a --no-compact run.
        report = await asyncio.to_thread(writer.recover, self.layout.parquet(c.shard_index, c.shard_count))
        # Room for a true progress.json and manifest entry should the volume fill up (freed then).
        writer.hold_reserve()
        if report.torn_bytes or report.corrupt_lines:
            log.warning(
                "recovered shard %d: dropped a torn tail of %d bytes and %d damaged lines; they will be regenerated",
                c.shard_index,
                report.torn_bytes,
                report.corrupt_lines,
            )
        self._writer = writer
        self._init_progress(report.records)
        self._client = GenerateClient(
            pool,
            policy=RetryPolicy(c.spec.clients.max_attempts, c.backoff_base_s, c.backoff_cap_s),
            request_timeout_s=c.spec.clients.request_timeout,
            stream=stream,
            on_retry=self.tracker.on_retry,
        )
        try:
            return await self._generate()
        finally:
            writer.release_reserve()

    def _init_progress(self, recovered: int) -> None:
        from datagen_operator.worker.progress import Tracker

        c, writer = self.config, self.writer
        # What earlier runs set aside: the rolling checks judge only what this run adds (docs/checks.md).
        aside_before = Counter(TOO_LONG if cause == TOO_LONG else "malformed" for cause in writer.set_aside.values())
        # Counts from what the writer holds on disk (never from an older progress.json); the dataset's
        # totals and what is left of each prompt come as the feeder reads the plan (`_plan_prompt`).
        counts = RecordCounts()
        counts.merge(writer.summary)
        counts.merge(writer.written)
        counts.records = len(writer.done)
        p = ShardProgress(
            shard=c.shard_index,
            shard_count=c.shard_count,
            state="running",
            servers_total=len(c.servers),
            started_at=self.progress.started_at,
            fingerprint_sha256=self.progress.fingerprint_sha256,
            counts=counts,
            records_rejected=len(writer.rejected),
        )
        self.remaining, self.planned = {}, False
        p.baseline = {
            "records": p.records_done,
            "tool_records": p.counts.tool_records,
            "rejected": p.records_rejected,
            "malformed": aside_before["malformed"],
            "too_long": aside_before[TOO_LONG],
            "flags": dict(p.flags),
        }
        self.progress = p
        self.tracker = Tracker(p)
        log.info(
            "shard %d/%d: %d records already recorded; reading the dataset as requests go out",
            c.shard_index,
            c.shard_count,
            p.records_done,
            extra={"fields": {"recovered_records": recovered}},
        )

    def _plan_line(self, line: Any) -> None:
        """A dataset line this shard owns that is set aside (bad JSON, id, messages, tools, duplicate)."""
        p = self.progress
        self.writer.add_reject(malformed_reject(line.position, line.reason, line.excerpt, line.id, line.cause))
        p.prompts_malformed += 1
        p.set_aside[line.cause] = p.set_aside.get(line.cause, 0) + 1

    def _plan_prompt(self, ref: Any) -> bool:
        """Count one valid prompt of the plan; True when samples of it are still to generate."""
        p, writer, n = self.progress, self.writer, self.samples
        p.prompts_total += 1
        p.records_total += n
        cause = writer.set_aside.get(f"line:{ref.position}")
        if cause is not None:
            # Set aside by an earlier run (unrenderable, too long): never sent again. Written before causes
            # existed, an unrenderable prompt's entry says only "malformed".
            cause = TOO_LONG if cause == TOO_LONG else UNRENDERABLE
            if cause == TOO_LONG:
                p.prompts_too_long += 1
            else:
                p.prompts_rejected += 1
            p.set_aside[cause] = p.set_aside.get(cause, 0) + 1
            p.records_set_aside += n
            p.prompts_done += 1
            return False
        left = sum(
            1 for sample in range(n) if (ref.id, sample) not in writer.done and (ref.id, sample) not in writer.rejected
        )
        if left:
            self.remaining[ref.id] = left
            return True
        p.prompts_done += 1
        return False

    def _count_from_disk(self, p: Any) -> None:
        """Set p's counts and totals exactly from the disk and a whole pass over the plan (a failure's
        final report: the feeder may not have read the whole plan)."""
        from datagen_operator.prompts.dataset import MalformedLine, ShardScan

        c, writer, n = self.config, self.writer, self.samples
        p.records_done = p.records_rejected = p.records_set_aside = p.prompts_done = 0
        p.prompts_total = p.records_total = p.prompts_malformed = p.prompts_rejected = p.prompts_too_long = 0
        p.set_aside = {}
        self.remaining = {}
        for item in ShardScan(c.dataset, c.shard_index, c.shard_count, c.spec.dataset.format):
            if isinstance(item, MalformedLine):
                p.prompts_malformed += 1
                p.set_aside[item.cause] = p.set_aside.get(item.cause, 0) + 1
                continue
            ref = item[0]
            if f"line:{ref.position}" not in writer.set_aside:
                p.records_done += sum(1 for sample in range(n) if (ref.id, sample) in writer.done)
                p.records_rejected += sum(1 for sample in range(n) if (ref.id, sample) in writer.rejected)
            self._plan_prompt(ref)

    # generation

    RENDER_BATCH = 32

    async def _feed(self, queue: asyncio.Queue[Any]) -> None:
        """Renders prompts still to do, in dataset order, a few batches ahead, and queues their jobs.

        Batches go to the render helpers concurrently; results are queued in submission order, so
        requests leave roughly in dataset order. The queue is bounded: rendering runs only as far ahead
        of the requests as the lanes can use.
        """
        from collections import deque

        from datagen_operator.prompts.dataset import MalformedLine, prompt_from

        n = self.samples
        ahead: deque[tuple[list[Any], asyncio.Future[list[Any]]]] = deque()
        max_ahead = max(2, 2 * self.inputs.render_pool.processes + 1)
        try:
            batch: list[Any] = []
            for index, item in enumerate(self.inputs.plan):
                if index % 512 == 511:
                    await asyncio.sleep(0)  # reading the plan: let the lanes move answers meanwhile
                if isinstance(item, MalformedLine):
                    self._plan_line(item)
                    continue
                ref, obj = item
                if not self._plan_prompt(ref):
                    continue
                batch.append(prompt_from(ref, obj))
                if len(batch) >= self.RENDER_BATCH:
                    ahead.append((batch, asyncio.ensure_future(self._render(batch))))
                    batch = []
                    while len(ahead) >= max_ahead:
                        await self._queue_rendered(queue, *ahead.popleft(), n)
            if batch:
                ahead.append((batch, asyncio.ensure_future(self._render(batch))))
            while ahead:
                await self._queue_rendered(queue, *ahead.popleft(), n)
            self.planned = True
            p = self.progress
            log.info(
                "dataset read: shard %d/%d has %d prompts (%d malformed lines set aside)",
                p.shard,
                p.shard_count,
                p.prompts_total,
                p.prompts_malformed,
            )
            for _ in range(self.config.spec.clients.concurrency):
                await queue.put(None)  # one end marker per lane, after the last job
        except Exception as error:
            self._set_fatal(EXIT_BAD_INPUT, f"reading or rendering the dataset failed: {type(error).__name__}: {error}")
            raise
        finally:
            for _, future in ahead:
                future.cancel()

    def _release_lanes(self) -> None:
        """Wake every lane waiting for a job so it can stop: queued jobs are dropped (not recorded, so
        the next run does them)."""
        queue = self.queue
        while not queue.empty():
            queue.get_nowait()
        for _ in range(self.config.spec.clients.concurrency):
            queue.put_nowait(None)

    async def _render(self, prompts: list[Any]) -> list[Any]:
        return await self.inputs.render_pool.render([(prompt.messages, prompt.tools) for prompt in prompts])

    async def _queue_rendered(
        self, queue: asyncio.Queue[Any], prompts: list[Any], future: asyncio.Future[list[Any]], n: int
    ) -> None:
        from datagen_operator.prompts.render import ids_from_result

        results = await future
        writer = self.writer
        limit: ContextLimit = self.context_limit
        max_new_tokens = int(self.inputs.sampling["max_new_tokens"])
        for prompt, result in zip(prompts, results, strict=True):
            if isinstance(result, str):
                self._set_aside(prompt.id, malformed_reject(prompt.position, result, "", prompt.id, UNRENDERABLE))
                continue
            input_ids = ids_from_result(result)
            # Checked here, before sending: SGLang would answer 400 (or cut the answer) for every sample.
            too_long = too_long_reason(len(input_ids), max_new_tokens, limit)
            if too_long is not None:
                self._set_aside(prompt.id, too_long_reject(prompt.position, prompt.id, too_long))
                continue
            has_tools = bool(prompt.tools)
            for sample in range(n):
                key = (prompt.id, sample)
                if key not in writer.done and key not in writer.rejected:
                    await queue.put(Job(prompt.position, prompt.id, sample, input_ids, has_tools))

    def _set_aside(self, prompt_id: str, entry: dict[str, Any]) -> None:
        """A prompt that is never sent: recorded once in rejects.jsonl, all its samples counted apart from
        server errors, the prompt done."""
        if not self._write(self.writer.add_reject, entry):
            return
        p, cause = self.progress, entry["cause"]
        if cause == TOO_LONG:
            p.prompts_too_long += 1
        else:
            p.prompts_rejected += 1
        p.set_aside[cause] = p.set_aside.get(cause, 0) + 1
        p.records_set_aside += self.remaining.pop(prompt_id)
        p.prompts_done += 1

    def _finish_key(self, prompt_id: str) -> None:
        left = self.remaining.get(prompt_id, 0) - 1
        if left <= 0:
            self.remaining.pop(prompt_id, None)
            self.progress.prompts_done += 1
        else:
            self.remaining[prompt_id] = left

    def _record(self, job: Job, reply: Reply) -> None:
        """Check, encode and buffer one answer (synchronous: nothing here waits)."""
        meta = reply.meta_info
        flags = inspect_record(
            job.input_ids,
            reply.output_ids,
            meta.get("finish_reason"),
            meta.get("completion_tokens"),
            job.has_tools,
            self.inputs.expect,
        )
        answer = Answer(reply.output_ids, meta, reply.server, reply.attempts, reply.latency_s)
        record = build_record(job, answer, flags)
        writer = self.writer
        writer.append(record, encode_record(record, reply.output_ids_json))
        # Written through at once (one write(), no fsync): a kill then loses only the requests in flight,
        # never answers held back in memory (they would be generated again on resume).
        if not self._write(writer.flush):
            return
        self.progress.counts.add(
            len(job.input_ids), len(reply.output_ids), meta.get("cached_tokens") or 0, flags, job.has_tools
        )
        self._finish_key(job.id)

    def _rejected(self, job: Job, rejected: Rejected) -> None:
        entry = server_reject(job, rejected.status or 0, rejected.reason, rejected.server, rejected.attempts)
        if not self._write(self.writer.add_reject, entry):
            return
        self.progress.records_rejected += 1
        self._finish_key(job.id)

    def _write(self, write: Any, *args: Any) -> bool:
        """Run one write to the output volume; False (and the shard stopping) when the volume failed."""
        from datagen_operator.output.volume import is_volume_error

        if self.volume_error is not None:
            return False
        try:
            write(*args)
        except OSError as error:
            if not is_volume_error(error):
                raise
            self._volume_failed(error)
            return False
        return True

    def _volume_failed(self, error: OSError) -> None:
        """The volume cannot take more: stop every request now (answers could not be kept), keep what is
        whole, and leave the cause for _finish to report."""
        self.volume_error = error
        self.unwritten += getattr(error, "unwritten", 0)
        self.abandon.set()  # no grace period: in-flight answers would be thrown away anyway
        self._set_fatal(EXIT_OUTPUT_VOLUME, f"output volume failed: {error}")

    async def _lane(self, queue: asyncio.Queue[Any]) -> None:
        """One of `concurrency` lanes: takes the next job, sends it, records it, repeats."""
        client, sampling = self.client, self.inputs.sampling
        while True:
            job = await queue.get()
            if job is None or self.stop_new.is_set():
                return
            try:
                reply = await client.generate(generate_payload(job, sampling, stream=client.stream))
            except Rejected as rejected:
                if self.volume_error is not None:
                    return
                self._rejected(job, rejected)
                continue
            except GaveUp as gave_up:
                log.warning("record %s#%d failed: %s", job.id, job.sample, gave_up.reason)
                self.progress.records_failed += 1
                continue
            except Drained:
                return
            except ServerUnreachable as error:
                self._set_fatal(EXIT_SERVER_UNREACHABLE, str(error))
                return
            except EndpointsRejected as error:
                self._set_fatal(EXIT_FINGERPRINT_MISMATCH, f"no usable server: {error}")
                return
            if self.volume_error is not None:
                self.unwritten += 1  # finished on the server as the volume failed: nowhere to keep it
                return
            self._record(job, reply)

    def _set_fatal(self, code: int, message: str) -> None:
        if self.fatal is None:
            self.fatal = (code, message)
            log.error("%s", message)
            self.stop_new.set()
            self.pool.stop.set()
            self._release_lanes()

    def _request_drain(self, sig: signal.Signals) -> None:
        if self.drained and not self.abandon.is_set():
            log.warning("%s again: abandoning the requests in flight now", sig.name)
            self.abandon.set()
            return
        if not self.stop_new.is_set():
            log.warning(
                "%s: draining (no new requests; %d in flight get %.0fs)",
                sig.name,
                self.pool.in_flight,
                self.config.drain_timeout_s,
            )
            self.drained = True
            self.progress.state = "draining"
            self.stop_new.set()
            # Requests waiting in backoff or for a server stop now; those on the wire may finish.
            self.pool.stop.set()
            self._release_lanes()

    async def _generate(self) -> int:
        from datagen_operator.worker.progress import ConfigMapSink, Display, FileSink, kubernetes_namespace

        c = self.config
        self._sinks = Sinks(
            FileSink(self.layout.progress(c.shard_index)),
            ConfigMapSink(c.progress_configmap, kubernetes_namespace(c.progress_namespace))
            if c.progress_configmap
            else None,
            Display(),
        )
        if c.metrics_port is not None:
            from datagen_operator.worker.metrics import serve_metrics

            serve_metrics(c.metrics_port, self._snapshot)
        await self._publish(force=True)

        # Start-up left millions of long-lived objects (tokenizer, transformers): keep the cyclic GC off
        # them, and let it run less often; per-record garbage is acyclic and freed by refcounting anyway.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        cpu_before = time.process_time()
        started, tokens_before, records_before = (
            time.perf_counter(),
            self.progress.output_tokens,
            self.progress.records_done,
        )
        lanes = [asyncio.create_task(self._lane(self.queue)) for _ in range(c.spec.clients.concurrency)]
        feeder = asyncio.create_task(self._feed(self.queue))
        background = [
            feeder,
            asyncio.create_task(self._flush_loop()),
            asyncio.create_task(self._progress_loop()),
        ]
        all_lanes = asyncio.gather(*lanes)
        try:
            await self._wait_lanes(all_lanes, lanes)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.pool.close()
        elapsed = time.perf_counter() - started
        made = self.progress.output_tokens - tokens_before
        log.info(
            "generation phase: %d records, %d output tokens in %.2fs",
            self.progress.records_done - records_before,
            made,
            elapsed,
            extra={
                "fields": {
                    "generation_s": round(elapsed, 4),
                    "generation_cpu_s": round(time.process_time() - cpu_before, 4),
                    "output_tokens_this_run": made,
                }
            },
        )
        return await self._finish()

    async def _wait_lanes(self, all_lanes: Any, lanes: list[asyncio.Task[None]]) -> None:
        stop_wait = asyncio.create_task(self.stop_new.wait())
        await asyncio.wait([all_lanes, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if all_lanes.done():
            all_lanes.result()
            return
        # Draining: in-flight requests get the grace period (or until a second signal), then are abandoned
        # (regenerated on resume).
        abandon = asyncio.create_task(self.abandon.wait())
        await asyncio.wait(
            [all_lanes, abandon], timeout=self.config.drain_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        abandon.cancel()
        pending = [task for task in lanes if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            log.warning("abandoned %d in-flight requests at the end of the drain period", len(pending))
        await asyncio.gather(*lanes, return_exceptions=True)

    async def _flush_loop(self) -> None:
        """Flush every interval, fsync every few; a volume failure stops the lanes (it must not end this
        task unseen while they go on generating)."""
        last_sync = time.monotonic()
        while self.volume_error is None:
            await asyncio.sleep(self.config.flush_interval_s)
            if not self._write(self.writer.flush):
                return
            if time.monotonic() - last_sync >= self.config.sync_interval_s:
                last_sync = time.monotonic()
                try:
                    await asyncio.to_thread(self.writer.sync)
                except OSError as error:  # sync raises volume errors only
                    self._volume_failed(error)
                    return

    def _snapshot(self) -> Any:
        p = self.tracker.snapshot()
        p.in_flight = self.pool.in_flight
        p.servers_up = sum(1 for e in self.pool.endpoints if e.up and e.disabled is None)
        if p.state in ("running", "paused"):
            p.state = "running" if p.servers_up else "paused"
        p.message = p.summary_line() if not p.message or p.state in ("running", "paused") else p.message
        return p

    async def _publish(self, *, force: bool = False) -> None:
        snapshot = self._snapshot()
        self.sinks.file.write(snapshot)
        self.sinks.display.update(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=force)

    async def _progress_loop(self) -> None:
        from datagen_operator.output.volume import is_volume_error

        while self.volume_error is None:
            await asyncio.sleep(self.config.progress_interval_s)
            try:
                await self._publish()
            except Exception as error:
                if is_volume_error(error):
                    self._volume_failed(error)  # type: ignore[arg-type]
                    return
                log.exception("progress update failed")

    async def _finish(self) -> int:
        c, p, writer = self.config, self.progress, self.writer
        if self.volume_error is None:
            self._write(writer.close)  # in this thread: a volume failure sets the worker's asyncio events
        if self.volume_error is not None:
            return await self._finish_volume_failed()
        # A drained worker does not start compacting (it could outlast the grace period); the next run does.
        complete = self.planned and not self.remaining and self.fatal is None and not self.drained
        if self.fatal is not None:
            code, message = self.fatal
            p.state, p.message = "failed", message
        elif complete:
            code = EXIT_OK
            p.state = "compacting" if c.compact else "complete"
            await self._publish(force=True)
            try:
                writer.release_reserve()  # compaction needs the room more
                result = await asyncio.to_thread(self._compact) if c.compact else None
            except OSError as error:
                from datagen_operator.output.volume import is_volume_error

                if is_volume_error(error):
                    self.volume_error = error
                    return await self._finish_volume_failed()
                code = EXIT_INCOMPLETE
                p.state, p.message = "incomplete", f"compaction failed ({error}); segments kept, rerun compacts"
                log.error("%s", p.message)
            else:
                p.state = "complete"
                p.message = p.summary_line() + (f", {result.path.name} {result.bytes} bytes" if result else "")
        elif self.drained:
            code = EXIT_DRAINED
            p.state, p.message = "drained", f"drained: {p.records_done}/{p.records_total} records; rerun resumes"
        else:
            code = EXIT_INCOMPLETE
            p.state = "incomplete"
            p.message = f"{p.records_failed} records ran out of attempts; rerun resumes them"
        self._update_manifest_shard(p)
        snapshot = self._snapshot()
        self.sinks.file.write(snapshot)
        self.sinks.display.close(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=True)
            await self.sinks.configmap.close()
        return code

    async def _finish_volume_failed(self) -> int:
        """Whole records stay, the torn rest is cut off; the cause goes out first where a full volume
        cannot hide it, then into progress.json and the manifest (written into the freed reserve)."""
        from datagen_operator.output.volume import free_bytes, volume_reason

        error, p, writer = self.volume_error, self.progress, self.writer
        assert error is not None
        writer.abort()
        free = free_bytes(self.config.output)  # what the volume had left, before the reserve is given back
        writer.release_reserve()
        self._count_from_disk(p)
        p.records_unwritten = self.unwritten
        p.failure_reason = volume_reason(error)
        p.state, p.message = "failed", self._volume_text(error, free)
        if self.unwritten:
            p.message += f" ({self.unwritten} answers could not be written and are generated again)"
        self._tell_cause(p.message)
        p.volume_path, p.volume_free_bytes = str(self.config.output), free
        snapshot = self._snapshot()
        for write in (lambda: self.sinks.file.write(snapshot), lambda: self._update_manifest_shard(p)):
            try:
                write()
            except OSError as failure:
                log.error("cannot record the failure on the volume: %s", failure)
        self.sinks.display.close(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=True)
            await self.sinks.configmap.close()
        return EXIT_OUTPUT_VOLUME

    def _compact(self) -> Any:
        from datagen_operator.output.parquet import compact_shard
        from datagen_operator.prompts.dataset import MalformedLine, ShardScan

        c = self.config
        scan = ShardScan(c.dataset, c.shard_index, c.shard_count, c.spec.dataset.format)
        order = (
            (item[0].id, sample)
            for item in scan
            if not isinstance(item, MalformedLine)
            for sample in range(self.samples)
        )
        result = compact_shard(self.layout, self.config.shard_index, self.config.shard_count, order)
        if result.orphans:
            log.warning("%d records are not in the current dataset; kept at the end of the Parquet", result.orphans)
        self.compaction = result
        return result

    def _update_manifest_shard(self, p: ShardProgress) -> None:
        record_shard(self.layout, self.config.shard_index, p, self.compaction)
