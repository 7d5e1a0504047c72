"""Fault decisions: a pure function of (fault config, seed, request number).

Each generation request gets the next request number; every kind of fault draws its own uniform number
from a hash of (seed, request number, kind), so a retried request may succeed, runs are reproducible,
and a rate of 1.0 (or 0.0) is exact. At most one of the response faults applies, in the order
5xx > reset > abort > NaN > stream error; a hang delays whatever follows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from datagen_operator.engine.sim.config import FaultConfig


@dataclass(frozen=True, slots=True)
class FaultPlan:
    hang_s: float = 0.0
    http_status: int | None = None
    """Answer with this 5xx status instead of generating."""
    reset: bool = False
    """Reset the connection halfway through the response body (or stream)."""
    abort: bool = False
    """Finish with finish_reason abort and half the output."""
    nan: bool = False
    """Halfway through, sample an id outside the vocabulary (NaN logits): SGLang's guard ends the answer there."""
    stream_error: bool = False
    """Send an error event halfway through a stream, then [DONE]."""
    retractions: int = 0
    """meta_info.num_retractions: not a failure, the answer is whole; only what SGLang reports changes."""

    @property
    def any(self) -> bool:
        return bool(self.hang_s or self.http_status or self.reset or self.abort or self.nan or self.stream_error)


NO_FAULTS = FaultPlan()


def uniform(seed: int, request_number: int, kind: str) -> float:
    """A number in [0, 1), fixed by its arguments."""
    digest = hashlib.blake2b(f"{seed}:{request_number}:{kind}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _hits(rate: float, seed: int, request_number: int, kind: str) -> bool:
    return rate >= 1.0 or (rate > 0.0 and uniform(seed, request_number, kind) < rate)


def plan_faults(config: FaultConfig, request_number: int) -> FaultPlan:
    if not (
        config.error_5xx_rate
        or config.reset_rate
        or config.abort_rate
        or config.nan_rate
        or config.stream_error_rate
        or config.hang_s
        or config.retraction_rate
    ):
        return NO_FAULTS
    seed = config.seed
    hang_s = config.hang_s if config.hang_s and _hits(config.hang_rate, seed, request_number, "hang") else 0.0
    retracted = retractions(config, request_number)
    if _hits(config.error_5xx_rate, seed, request_number, "5xx"):
        return FaultPlan(hang_s=hang_s, http_status=config.error_5xx_status)
    if _hits(config.reset_rate, seed, request_number, "reset"):
        return FaultPlan(hang_s=hang_s, reset=True, retractions=retracted)
    if _hits(config.abort_rate, seed, request_number, "abort"):
        return FaultPlan(hang_s=hang_s, abort=True, retractions=retracted)
    if _hits(config.nan_rate, seed, request_number, "nan"):
        return FaultPlan(hang_s=hang_s, nan=True, retractions=retracted)
    if _hits(config.stream_error_rate, seed, request_number, "stream-error"):
        return FaultPlan(hang_s=hang_s, stream_error=True, retractions=retracted)
    return FaultPlan(hang_s=hang_s, retractions=retracted)


def retractions(config: FaultConfig, request_number: int) -> int:
    """How often SGLang retracted this request (0 or 1): its own draw, beside any fault."""
    return int(_hits(config.retraction_rate, config.seed, request_number, "retraction"))
