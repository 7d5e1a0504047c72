"""The generation phase: the feeder, `concurrency` lanes, the flush and progress loops and the dataset's watch
run together; the drain waits for requests in flight; then the finisher says how the shard ended."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.output.writer import ShardWriter
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.dataset_watch import DatasetWatch
from datagen_operator.worker.feeder import Feeder
from datagen_operator.worker.finishing import Finisher
from datagen_operator.worker.lanes import Lanes
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.publisher import Publisher
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.volume_guard import VolumeGuard

log = logging.getLogger("datagen.worker")


class Generation:
    def __init__(
        self,
        config: WorkerConfig,
        pool: EndpointPool,
        writer: ShardWriter,
        ledger: Ledger,
        stop: Stop,
        volume: VolumeGuard,
        publisher: Publisher,
        feeder: Feeder,
        lanes: Lanes,
        finisher: Finisher,
    ) -> None:
        self.config = config
        self.pool = pool
        self.writer = writer
        self.ledger = ledger
        self.stop = stop
        self.volume = volume
        self.publisher = publisher
        self.feeder = feeder
        self.lanes = lanes
        self.finisher = finisher

    async def run(self) -> int:
        c, p = self.config, self.ledger.progress
        if c.metrics_port is not None:
            from datagen_operator.worker.metrics import serve_metrics  # prometheus_client only where asked for

            serve_metrics(c.metrics_port, self.publisher.snapshot)
        await self.publisher.publish(force=True)

        # Start-up left millions of long-lived objects (tokenizer, transformers): keep the cyclic GC off
        # them, and let it run less often; per-record garbage is acyclic and freed by refcounting anyway.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        cpu_before = time.process_time()
        started, tokens_before, records_before = time.perf_counter(), p.counts.output_tokens, p.records_done
        lanes = [asyncio.create_task(self.lanes.lane()) for _ in range(c.concurrency)]
        background = [
            asyncio.create_task(self.feeder.feed()),
            asyncio.create_task(self._flush_loop()),
            asyncio.create_task(self.publisher.loop()),
            asyncio.create_task(DatasetWatch(c, self.stop).loop()),
        ]
        try:
            await self._wait_lanes(lanes)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.pool.close()
        elapsed = time.perf_counter() - started
        made = p.counts.output_tokens - tokens_before
        log.info(
            "generation phase: %d records, %d output tokens in %.2fs",
            p.records_done - records_before,
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
        return await self.finisher.finish()

    async def _wait_lanes(self, lanes: list[asyncio.Task[None]]) -> None:
        # Typed as plain futures: asyncio.wait takes one kind, and the lanes' results are not read.
        all_lanes: asyncio.Future[Any] = asyncio.gather(*lanes)
        stop_wait: asyncio.Future[Any] = asyncio.create_task(self.stop.stop_new.wait())
        await asyncio.wait([all_lanes, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if all_lanes.done():
            all_lanes.result()
            return
        # Draining: in-flight requests get the grace period (or until a second signal), then are abandoned
        # (regenerated on resume).
        abandon: asyncio.Future[Any] = asyncio.create_task(self.stop.abandon.wait())
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
        # The first gather took its cancelled lanes' CancelledError as its outcome: read it, or asyncio logs it
        # as "exception was never retrieved", with a traceback, when the gather is freed.
        await asyncio.wait([all_lanes])
        if not all_lanes.cancelled():
            all_lanes.exception()

    async def _flush_loop(self) -> None:
        """Flush every interval, fsync every few; a volume failure stops the lanes (it must not end this task
        unseen while they go on generating)."""
        c, writer, volume = self.config, self.writer, self.volume
        last_sync = time.monotonic()
        while volume.error is None:
            await asyncio.sleep(c.flush_interval_s)
            if not volume.write(writer.flush):
                return
            if time.monotonic() - last_sync >= c.sync_interval_s:
                last_sync = time.monotonic()
                try:
                    await asyncio.to_thread(writer.sync)
                except OSError as error:  # sync raises volume errors only
                    self.volume.failed(error)
                    return
