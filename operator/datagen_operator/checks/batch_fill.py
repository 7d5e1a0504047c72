"""Whether the run's clients can keep the servers' batches full: shards x clients.concurrency requests in flight
against what the servers run at once, each as its `/server_info` says (engine/limits.batch_limits) and as its
token pool holds requests of the canary's length. Below that, GPUs sit partly idle for the whole run: a warning
(the canary still passes) with the number that fills them. With `clients.concurrency: auto` that number is the
run's (`auto_concurrency`): the canary records it and the workers send at it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from datagen_operator.api.spec import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from datagen_operator.api.status import CheckResult
from datagen_operator.engine.limits import BatchLimits

BATCH_FULL = "batch_full"
HEADROOM_PERCENT = 110
"""Requests kept in flight per batch slot (in percent): each lane spends a moment between an answer and its next request, so
a slot-for-slot client leaves a few slots empty at any moment; SGLang queues the extra ones (bench/batch.py)."""


def batch_slots(limits: BatchLimits, tokens_per_request: float | None) -> int:
    """Requests one server runs at once: its `max_running_requests`, or fewer where its token pool holds fewer
    requests of this many tokens (prompt and answer: SGLang admits a request only while the pool has room)."""
    if not tokens_per_request or tokens_per_request <= 0:
        return limits.max_running_requests
    return max(1, min(limits.max_running_requests, int(limits.token_pool // tokens_per_request)))


def suggested_concurrency(slots: int, shards: int) -> int:
    """clients.concurrency per shard that keeps `slots` batch slots full, with HEADROOM_PERCENT (rounded up)."""
    return max(1, min(MAX_CONCURRENCY, -(-slots * HEADROOM_PERCENT // (100 * max(1, shards)))))


@dataclass(frozen=True)
class ServerSlots:
    """The batch slots of the servers that said their limits, one count per server."""

    per_server: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.per_server)

    @property
    def counted(self) -> str:
        return f"{len(self.per_server)} server{'s' if len(self.per_server) != 1 else ''}"

    @property
    def each(self) -> str:
        """ "64 each", or "256+128" where the servers differ."""
        same = len(set(self.per_server)) == 1
        return f"{self.per_server[0]} each" if same else "+".join(map(str, self.per_server))


def server_slots(servers: Sequence[BatchLimits | None], tokens_per_request: float | None) -> ServerSlots | None:
    """None when no server said its limits (an older SGLang)."""
    known = [batch_slots(s, tokens_per_request) for s in servers if s is not None]
    return ServerSlots(tuple(known)) if known else None


@dataclass(frozen=True)
class AutoConcurrency:
    """`clients.concurrency: auto` resolved: the requests in flight per shard, and the words that say why."""

    concurrency: int
    said: str


def auto_concurrency(
    shards: int, servers: Sequence[BatchLimits | None], tokens_per_request: float | None = None
) -> AutoConcurrency:
    """The number that fills the servers' batches (`suggested_concurrency`, the rule the warning names); the
    default where no server said its limits (nothing to size it by)."""
    slots = server_slots(servers, tokens_per_request)
    of = f" x {shards} shards" if shards > 1 else ""
    if slots is None:
        return AutoConcurrency(
            DEFAULT_CONCURRENCY,
            f"clients.concurrency auto: {DEFAULT_CONCURRENCY} per shard{of}, the default (no server said its batch "
            "limits in /server_info)",
        )
    concurrency = suggested_concurrency(slots.total, shards)
    sizes = str(slots.per_server[0]) if len(set(slots.per_server)) == 1 else slots.each
    return AutoConcurrency(
        concurrency, f"clients.concurrency auto: {concurrency} per shard{of} for {slots.counted} of {sizes} slots"
    )


def judge_batch_fill(
    shards: int,
    concurrency: int,
    servers: Sequence[BatchLimits | None],
    tokens_per_request: float | None = None,
) -> CheckResult | None:
    """The check, passed either way (a run with a part-empty batch still writes faithful data); its verdict
    warns when the requests in flight cannot fill the servers' slots. None when no server said its limits."""
    known = server_slots(servers, tokens_per_request)
    if known is None:
        return None
    slots, counted, each = known.total, known.counted, known.each
    in_flight = shards * concurrency
    used = min(1.0, in_flight / slots)
    if in_flight >= slots:
        verdict = f"{in_flight} requests in flight fill the {slots} batch slots of {counted} ({each})"
    else:
        suggest = suggested_concurrency(slots, shards)
        verdict = (
            f"{in_flight} requests in flight for {counted} that run {each}: at most {_percent(used)}% of "
            f"their batch slots used; set clients.concurrency: {suggest}"
            + (f" (with clients.shards: {shards})" if shards > 1 else "")
        )
    return CheckResult(name=BATCH_FULL, passed=True, rate=used, count=in_flight, total=slots, verdict=verdict)


def _percent(share: float) -> str:
    """Rounded down, as "at most" says, to its first digit that is not 0: 12.5 % is 12, 0.39 % is 0.3."""
    percent = share * 100
    if percent >= 1 or percent <= 0:
        return str(math.floor(percent))
    digits = max(1, -math.floor(math.log10(percent)))
    return f"{math.floor(percent * 10**digits) / 10**digits:.{digits}f}"


def underfilled(check: CheckResult | None) -> bool:
    return check is not None and check.count < check.total
