"""Whether the clients keep the server busy: time with fewer /generate requests in flight than they should keep
(`--sim-expected-in-flight`), measured from bulk start -- the first moment that many were in flight (every
client sending); the first request if it never comes -- to the last answer, and apart up to the last request
received (while work was still unsent somewhere: what a client could have filled). Two measures of it: the
seconds with any slot empty (`underfilled`: strict, and at simulated request times of a fraction of a second
dominated by each lane's millisecond between an answer and its next request), and the empty slots times
seconds (`idle_slots`: the batch capacity left unused, what costs GPU time). Not an SGLang metric: the
simulator's own (`sglang_sim:*`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Occupancy:
    expected: int
    in_flight: int = 0
    first_request: float | None = None
    bulk_start: float | None = None
    """When `expected` requests were first in flight."""
    last_event: float = 0.0
    underfilled: float = 0.0
    """Seconds below `expected` since the window opened, up to `last_event`."""
    idle_slots: float = 0.0
    """Slot-seconds below `expected` (each missing request times its seconds), likewise."""
    last_request: float | None = None
    underfilled_at_last_request: float = 0.0
    idle_at_last_request: float = 0.0
    last_answer: float | None = None
    underfilled_at_last_answer: float = 0.0
    idle_at_last_answer: float = 0.0

    def arrived(self, now: float) -> None:
        self._advance(now)
        if self.first_request is None:
            self.first_request = now
        self.in_flight += 1
        if self.bulk_start is None and self.in_flight >= self.expected:
            self.bulk_start = now
            self.underfilled = self.idle_slots = 0.0  # the ramp before every client was sending is not counted
        self.last_request, self.underfilled_at_last_request, self.idle_at_last_request = (
            now,
            self.underfilled,
            self.idle_slots,
        )

    def left(self, now: float) -> None:
        self._advance(now)
        self.in_flight -= 1
        self.last_answer, self.underfilled_at_last_answer, self.idle_at_last_answer = (
            now,
            self.underfilled,
            self.idle_slots,
        )

    def _advance(self, now: float) -> None:
        if self.first_request is not None and self.in_flight < self.expected:
            self.underfilled += now - self.last_event
            self.idle_slots += (self.expected - self.in_flight) * (now - self.last_event)
        self.last_event = now

    @property
    def start(self) -> float | None:
        return self.bulk_start if self.bulk_start is not None else self.first_request

    def bulk_seconds(self) -> float:
        """Bulk start to the last answer."""
        start = self.start
        return 0.0 if start is None or self.last_answer is None else max(0.0, self.last_answer - start)

    def underfilled_seconds(self) -> float:
        return self.underfilled_at_last_answer if self.last_answer is not None else 0.0

    def sending_seconds(self) -> float:
        """Bulk start to the last request received."""
        start = self.start
        return 0.0 if start is None or self.last_request is None else max(0.0, self.last_request - start)

    def sending_underfilled_seconds(self) -> float:
        return self.underfilled_at_last_request

    def idle_slot_seconds(self) -> float:
        """Empty slots x seconds, bulk start to the last answer (/ expected x bulk_seconds: the capacity unused)."""
        return self.idle_at_last_answer if self.last_answer is not None else 0.0

    def sending_idle_slot_seconds(self) -> float:
        return self.idle_at_last_request
