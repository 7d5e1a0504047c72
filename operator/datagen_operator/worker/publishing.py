"""Publishing progress: the snapshot of the shard's counters and servers, written to progress.json,
the display and the ConfigMap, now and every progress interval."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from datagen_operator.worker.stopping import Stopping

log = logging.getLogger("datagen.worker")


class Publishing(Stopping):
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
