"""The queue between the feeder and the lanes: jobs in dataset order, then one end marker (None) per lane."""

from __future__ import annotations

import asyncio

from datagen_operator.prompts.job import Job


class JobQueue:
    """Bounded to twice the lanes: the feeder renders only as far ahead as the lanes can use."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.queue: asyncio.Queue[Job | None] = asyncio.Queue(maxsize=2 * lanes)
        self._low: int | None = None
        self._reached = asyncio.Event()

    async def put(self, job: Job) -> None:
        await self.queue.put(job)

    async def get(self) -> Job | None:
        job = await self.queue.get()
        if self._low is not None and self.queue.qsize() <= self._low:
            self._reached.set()
        return job

    async def wait_low(self, jobs: int) -> None:
        """Until at most `jobs` jobs are queued (the lanes took the rest)."""
        while self.queue.qsize() > jobs:
            self._low = jobs
            self._reached.clear()
            await self._reached.wait()
        self._low = None

    async def end(self) -> None:
        """One end marker per lane, after the last job."""
        for _ in range(self.lanes):
            await self.queue.put(None)

    def release(self) -> None:
        """Wake every lane waiting for a job so it can stop: queued jobs are dropped (not recorded, so the
        next run does them)."""
        queue = self.queue
        while not queue.empty():
            queue.get_nowait()
        for _ in range(self.lanes):
            queue.put_nowait(None)
