"""Every write to the output volume during generation goes through here: a volume that cannot take more stops
the shard at once (answers could not be kept) and leaves its cause for the finisher to report."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVarTuple

from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME
from datagen_operator.output.volume import is_volume_error, volume_reason
from datagen_operator.worker.stop import Stop

Args = TypeVarTuple("Args")


class VolumeGuard:
    def __init__(self, stop: Stop) -> None:
        self.stop = stop
        self.error: OSError | None = None
        self.unwritten = 0
        """Answers that reached this worker but not the volume (buffered at the failure, or arriving after)."""

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
