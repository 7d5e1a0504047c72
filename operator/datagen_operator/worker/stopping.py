"""How a worker stops: signals (drain, then abandon), a fatal error, a failing output volume, and a
failure before generation (reported on stderr, the termination log and progress.json)."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import time
from typing import Any

import orjson

from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME
from datagen_operator.api.progress import ShardProgress
from datagen_operator.output.layout import OutputLayout
from datagen_operator.worker.state import WorkerState

log = logging.getLogger("datagen.worker")


class Stopping(WorkerState):
    def _volume_text(self, error: OSError, free: int | None = None) -> str:
        from datagen_operator.output.volume import free_bytes, volume_failure_text, volume_reason

        p, output = self.progress, self.config.output
        reason = volume_reason(error)
        free = free_bytes(output) if free is None else free
        text = volume_failure_text(reason, output, free, p.records_done, p.records_total, error.strerror or str(error))
        return f"{reason}: {text}"

    def _fail(self, code: int, message: str, reason: str = "") -> int:
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

    def _release_lanes(self) -> None:
        """Wake every lane waiting for a job so it can stop: queued jobs are dropped (not recorded, so
        the next run does them)."""
        queue = self.queue
        while not queue.empty():
            queue.get_nowait()
        for _ in range(self.config.spec.clients.concurrency):
            queue.put_nowait(None)
