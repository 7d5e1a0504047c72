"""How a worker is told to stop: a signal (drain, then abandon) or a fatal error; either stops new requests,
wakes the requests waiting for a server and the lanes waiting for a job."""

from __future__ import annotations

import asyncio
import logging
import signal

from datagen_operator.api.reasons import Reason
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.worker.jobs import JobQueue
from datagen_operator.worker.progress import Tracker

log = logging.getLogger("datagen.worker")


class Stop:
    def __init__(self, pool: EndpointPool, jobs: JobQueue, tracker: Tracker, drain_timeout_s: float) -> None:
        self.pool = pool
        self.jobs = jobs
        self.tracker = tracker
        self.drain_timeout_s = drain_timeout_s
        self.stop_new = asyncio.Event()
        """Set by SIGTERM or a fatal error: no new requests."""
        self.abandon = asyncio.Event()
        """A second SIGTERM/SIGINT (or a failed volume): stop waiting for requests in flight."""
        self.drained = False
        self.fatal: tuple[int, str, Reason] | None = None
        """The exit code, message and named cause of the first fatal error."""

    def set_fatal(self, code: int, message: str, reason: Reason) -> None:
        if self.fatal is None:
            self.fatal = (code, message, reason)
            log.error("%s", message)
            self._stop_requests()

    def request_drain(self, sig: signal.Signals) -> None:
        if self.drained and not self.abandon.is_set():
            log.warning("%s again: abandoning the requests in flight now", sig.name)
            self.abandon.set()
            return
        if not self.stop_new.is_set():
            log.warning(
                "%s: draining (no new requests; %d in flight get %.0fs)",
                sig.name,
                self.pool.in_flight,
                self.drain_timeout_s,
            )
            self.drained = True
            self.tracker.progress.state = "draining"
            # Requests waiting in backoff or for a server stop now; those on the wire may finish.
            self._stop_requests()

    def _stop_requests(self) -> None:
        self.stop_new.set()
        self.pool.stop.set()
        self.jobs.release()
