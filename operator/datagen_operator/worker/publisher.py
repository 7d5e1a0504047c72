"""Publishing progress: the snapshot of the shard's counters and servers, written to progress.json, the
display and the ConfigMap, now and every progress interval (the output's lease renewed on the way)."""

from __future__ import annotations

import asyncio
import logging

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import Reason
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.output.volume import is_volume_error
from datagen_operator.worker.lease import WorkerLease
from datagen_operator.worker.progress import Sinks, Tracker
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.volume_guard import VolumeGuard

log = logging.getLogger("datagen.worker")


class Publisher:
    def __init__(
        self,
        tracker: Tracker,
        pool: EndpointPool,
        sinks: Sinks,
        lease: WorkerLease,
        stop: Stop,
        volume: VolumeGuard,
        interval_s: float,
    ) -> None:
        self.tracker = tracker
        self.pool = pool
        self.sinks = sinks
        self.lease = lease
        self.stop = stop
        self.volume = volume
        self.interval_s = interval_s

    def snapshot(self) -> ShardProgress:
        p = self.tracker.snapshot()
        p.in_flight = self.pool.in_flight
        p.servers_up = sum(1 for e in self.pool.endpoints if e.up and e.disabled is None)
        if p.state in ("running", "paused"):
            p.state = "running" if p.servers_up else "paused"
        p.message = p.summary_line() if not p.message or p.state in ("running", "paused") else p.message
        return p

    async def publish(self, *, force: bool = False) -> None:
        snapshot = self.snapshot()
        self.sinks.file.write(snapshot)
        self.sinks.display.update(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=force)

    async def close(self, snapshot: ShardProgress) -> None:
        """The last snapshot to the display and the ConfigMap, which close after it. progress.json is not
        written here: the finisher writes it itself, where a failed volume may refuse it."""
        self.sinks.display.close(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=True)
            await self.sinks.configmap.close()

    async def loop(self) -> None:
        while self.volume.error is None:
            await asyncio.sleep(self.interval_s)
            taken = await self.lease.renew()
            if taken is not None:
                self.stop.set_fatal(EXIT_BAD_INPUT, taken, Reason.OUTPUT_IN_USE)
                return
            try:
                await self.publish()
            except Exception as error:
                if is_volume_error(error):
                    self.volume.failed(error)
                    return
                log.exception("progress update failed")
