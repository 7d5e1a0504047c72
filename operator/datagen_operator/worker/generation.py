"""The generation loop: `concurrency` lanes send jobs and record each answer or rejection, the writer
is flushed and synced as they go, the drain waits for requests in flight."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from datagen_operator.api.exit_codes import (
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.checks.record_checks import inspect_record
from datagen_operator.engine.client.generate import Reply
from datagen_operator.engine.client.policy import (
    Drained,
    EndpointsRejected,
    GaveUp,
    Rejected,
    ServerUnreachable,
)
from datagen_operator.output.records import (
    Answer,
    Job,
    build_record,
    encode_record,
    generate_payload,
    server_reject,
)
from datagen_operator.worker.finishing import Finishing
from datagen_operator.worker.progress import Sinks

log = logging.getLogger("datagen.worker")


class Generation(Finishing):
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
        record = build_record(job, answer, flags, self.run_id)
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
