"""Publishing progress: the snapshot of the shard's counters and servers, written to progress.json,
the display and the ConfigMap, now and every progress interval."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
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

    async def _renew_lease(self) -> bool:
        """Renew the output's lease every LEASE_RENEW_S; False (the worker stops) once another run holds it."""
        from datagen_operator.output.lease import LEASE_RENEW_S, WORKER_LEASE_S, OutputInUse, take_lease

        holder = self.config.lease_holder
        if holder is None or time.monotonic() - self.lease_renewed < LEASE_RENEW_S:
            return True
        try:
            await asyncio.to_thread(take_lease, self.config.output, holder, WORKER_LEASE_S)
        except OutputInUse as busy:
            self._set_fatal(EXIT_BAD_INPUT, str(busy))
            return False
        except OSError as error:
            log.warning("could not renew the output's lease: %s", error)  # the next tick tries again
            return True
        self.lease_renewed = time.monotonic()
        return True

    async def _progress_loop(self) -> None:
        from datagen_operator.output.volume import is_volume_error

        while self.volume_error is None:
            await asyncio.sleep(self.config.progress_interval_s)
            if not await self._renew_lease():
                return
            try:
                await self._publish()
            except Exception as error:
                if is_volume_error(error):
                    self._volume_failed(error)
                    return
                log.exception("progress update failed")
