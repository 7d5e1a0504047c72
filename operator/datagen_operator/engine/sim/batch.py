"""The scheduler's running batch as the simulator paces it: batch slots (at gpu speed a request beyond every DP
rank's max_running_requests waits, in SGLang's waiting queue), the running and queued gauges kept right even when
a client disconnects, how long a request takes at gpu speed, and a scheduler stall (--sim-fault-stall-s)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from datagen_operator.engine.sim.config import SpeedConfig

if TYPE_CHECKING:
    from datagen_operator.engine.sim.metrics import SimMetrics


class RunningBatch:
    def __init__(self, speed: SpeedConfig, slots: int, metrics: SimMetrics | None) -> None:
        self.speed = speed
        self.gpu = speed.mode == "gpu"
        self.metrics = metrics
        self.slots = asyncio.Semaphore(slots)
        """The running batch: requests beyond every rank's max_running_requests wait (gpu speed)."""
        self.waiting = 0
        """Requests waiting for a batch slot: SGLang's waiting queue."""
        self.stalled_until = 0.0
        """Until when (monotonic) the scheduler makes nothing: one stall per server, it never moves once set."""

    async def through_stall(self) -> None:
        """Hold an answer while the scheduler is stalled (--sim-fault-stall-s)."""
        rest = self.stalled_until - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)

    @contextlib.asynccontextmanager
    async def generating(self, prompt_tokens: int, cached_tokens: int) -> AsyncIterator[None]:
        """Hold a batch slot (gpu speed: queue when full) and keep the running/queue gauges right even when
        the client disconnects (which cancels the handler)."""
        metrics = self.metrics
        if self.gpu:
            if metrics is not None:
                metrics.queued.inc()
            self.waiting += 1
            try:
                await self.slots.acquire()
            finally:
                self.waiting -= 1
                if metrics is not None:
                    metrics.queued.dec()
        if metrics is not None:
            metrics.started(prompt_tokens, cached_tokens)
        try:
            yield
        finally:
            if metrics is not None:
                metrics.stopped(prompt_tokens)
            if self.gpu:
                self.slots.release()

    def finished(self, prompt_tokens: int, completion_tokens: int, received: float) -> None:
        if self.metrics is not None:
            e2e = time.perf_counter() - received
            ttft = min(e2e, self.speed.ttft_s) if self.gpu else e2e
            self.metrics.finished(prompt_tokens, completion_tokens, ttft, e2e)

    async def run(self, prompt_tokens: int, completion_tokens: int, cached: int, received: float) -> None:
        """One request of an answer sent whole: its slot held for as long as it takes at gpu speed."""
        async with self.generating(prompt_tokens, cached):
            if self.gpu:
                await asyncio.sleep(self.speed.ttft_s + completion_tokens / self.speed.tokens_per_s)
            await self.through_stall()
        self.finished(prompt_tokens, completion_tokens, received)

    def due_s(self, tokens: int) -> float:
        """When (from the request's start) an answer's first `tokens` are made, at gpu speed; at once at wire."""
        if not self.gpu:
            return 0.0
        speed = self.speed
        return speed.ttft_s + tokens / speed.tokens_per_s if tokens else speed.ttft_s
