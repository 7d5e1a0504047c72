"""Every write to the output volume during generation goes through here: a volume that cannot take more stops
the shard at once (answers could not be kept) and leaves its cause for the finisher to report.

Before each new request the lanes ask `may_send`: once the volume is known full no request goes out, so the
server generates no answer that could not be stored beyond those already in flight. Known full: a write failed
here; or the free space fell below what this shard's requests in flight may write (`margin`, from the largest
record so far); or another shard of this attempt found it full (its `volume_full` marker, written in the room
its freed reserve gives: that room is for last words, not for more answers).
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVarTuple

from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME
from datagen_operator.api.reasons import Reason
from datagen_operator.output.layout import write_atomic
from datagen_operator.output.volume import free_bytes, is_volume_error, volume_reason
from datagen_operator.worker.stop import Stop

Args = TypeVarTuple("Args")

CHECK_INTERVAL_S = 0.02
"""How often `may_send` looks at the volume (a statvfs and a stat): at most this late to know it is full."""


def _identity(path: Path | None) -> tuple[int, int] | None:
    try:
        st = path.stat() if path is not None else None
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns) if st is not None else None


class VolumeGuard:
    def __init__(self, stop: Stop, output: Path | None = None, marker: Path | None = None, in_flight: int = 0) -> None:
        self.stop = stop
        self.error: OSError | None = None
        self.unwritten = 0
        """Answers that reached this worker but not the volume (buffered at the failure, or arriving after)."""
        self.output = output
        self.marker = marker
        self._stale_marker = _identity(marker)
        """A marker already there at start-up is an earlier attempt's: only a new one says full now."""
        self.in_flight = in_flight
        """Requests this shard may have in flight (clients.concurrency): what the margin must hold."""
        self.largest_record = 0
        """Bytes of the largest record written so far."""
        self.known_full: OSError | None = None
        """Set when the volume is known full before a write failed: no new request; those in flight finish."""
        self._checked = 0.0

    @property
    def margin(self) -> int:
        """Free bytes below which the volume is full: the records this shard's requests in flight may write."""
        return self.in_flight * self.largest_record

    def write(self, write: Callable[[*Args], object], *args: *Args) -> bool:
        """Run one write to the output volume; False (and the shard stopping) when the volume failed."""
        if self.error is not None:
            return False
        try:
            write(*args)
        except OSError as error:
            if not is_volume_error(error):
                raise
            self.failed(error)
            return False
        return True

    def failed(self, error: OSError) -> None:
        """The volume cannot take more: stop every request now (answers could not be kept), keep what is
        whole, and leave the cause for the finisher to report."""
        self.error = error
        self.unwritten += getattr(error, "unwritten", 0)
        self.stop.abandon.set()  # no grace period: in-flight answers would be thrown away anyway
        self.stop.set_fatal(EXIT_OUTPUT_VOLUME, f"output volume failed: {error}", volume_reason(error))

    def may_send(self) -> bool:
        """Whether a new request may go out: not once the volume is known full (module docstring)."""
        if self.error is not None or self.known_full is not None:
            return False
        now = time.monotonic()
        if self.output is None or now - self._checked < CHECK_INTERVAL_S:
            return True
        self._checked = now
        why = self._full()
        if why is None:
            return True
        self.known_full = OSError(errno.ENOSPC, why)
        # Those in flight may finish and be written (the margin holds them); no grace is cut short.
        self.stop.set_fatal(EXIT_OUTPUT_VOLUME, f"output volume full: {why}", Reason.OUTPUT_VOLUME_FULL)
        return False

    def _full(self) -> str | None:
        identity = _identity(self.marker)
        if identity is not None and identity != self._stale_marker:
            return "another shard found the volume full: no new request was sent"
        free = free_bytes(self.output) if self.output is not None else None
        if free is not None and free < self.margin:
            return (
                f"below the {self.margin} bytes its {self.in_flight} requests in flight may write: "
                "no new request was sent"
            )
        return None

    def tell_peers(self) -> None:
        """Leave the marker that stops the other shards' requests (written where the freed reserve gave room)."""
        if self.marker is not None:
            with contextlib.suppress(OSError):  # then the peers find it full at their next write
                write_atomic(self.marker, b"full\n", durable=False)
