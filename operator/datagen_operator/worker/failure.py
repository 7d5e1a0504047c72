"""A shard that fails before it can finish (bad input, a fingerprint mismatch, no server, a volume failing at
start-up): the cause where a failing volume cannot hide it (stderr, the termination message), then progress.json."""

from __future__ import annotations

import contextlib
import logging
import sys
import time

import orjson

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import Reason
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.volume import free_bytes, volume_failure_text, volume_reason
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.progress import FileSink, Tracker

log = logging.getLogger("datagen.worker")


class FailureReport:
    def __init__(self, config: WorkerConfig, tracker: Tracker) -> None:
        self.config = config
        self.tracker = tracker

    def volume_text(self, error: OSError, free: int | None = None) -> str:
        p, output = self.tracker.progress, self.config.output
        reason = volume_reason(error)
        free = free_bytes(output) if free is None else free
        return volume_failure_text(reason, output, free, p.records_done, p.records_total, error.strerror or str(error))

    def fail(self, code: int, message: str, reason: Reason) -> int:
        """Report the failure and return `code`."""
        self.tell_cause(reason, message)
        layout = OutputLayout(self.config.output)
        path = layout.progress(self.config.shard_index)
        if layout.shard_dir(self.config.shard_index).is_dir():
            # Before generation the counters are not loaded: keep the last run's, change only the state.
            snapshot = self.tracker.progress
            if snapshot.records_total == 0 and path.exists():
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

    def tell_cause(self, reason: Reason, message: str) -> None:
        """The failure's cause where a failing output volume cannot hide it: stderr (one plain line, before
        any log handler that may write to that volume) and the termination message, as the shard's verdict
        (api.outcome.StepOutcome, the contract every pod of a run ends with): the run names `reason` and shows
        `message` as they are, never a log line or a message cut from the front."""
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"datagen worker shard {self.config.shard_index}: {reason}: {message}\n")
            sys.stderr.flush()
        if self.config.termination_log is not None:
            with contextlib.suppress(OSError):
                self.config.termination_log.write_bytes(StepOutcome(False, reason, message).for_storage())
