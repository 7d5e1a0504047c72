"""Endpoints of one run's servers: which are up, probed back in while down, picked by load, a conversation's
turns kept on the server that holds its prefix in its radix cache."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from datagen_operator.engine.client.policy import Drained, EndpointsRejected, ServerUnreachable
from datagen_operator.engine.client.reads import is_healthy

log = logging.getLogger("datagen.engine.client")


@dataclass
class Endpoint:
    url: str
    up: bool = True
    in_flight: int = 0
    served: int = 0
    disabled: str | None = None
    """Why this endpoint is permanently out of rotation (its /server_info differs from the run's)."""
    probe: asyncio.Task[None] | None = None
    generate_url: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from yarl import URL

        self.generate_url = URL(self.url + "/generate")  # parsed once, not per request


Verifier = Callable[[Endpoint], Awaitable[str | None]]
"""Checks an endpoint that (re)appeared; returns why it must not be used, or None."""

LOAD_CAP = 1.2
"""A conversation not yet placed goes to a server only while it has fewer in flight than this times the mean (of
the up servers, this request counted): consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam)."""
PINNED_LOAD_CAP = 1.5
"""A placed conversation leaves its server (and its cached history) only at this times the mean (as SGLang's router
keeps cache affinity until loads differ by 1.5x, `--balance-rel-threshold`): above LOAD_CAP, since new
conversations fill a server up to LOAD_CAP and must not push that server's own conversations off it. With both at
1.2, bench/affinity.py reached 0.93 of one shared cache's hits (turns bumped off a full server prefilled their
history again); with this, 0.98."""
MAX_PINNED = 1 << 16
"""Keys remembered with the server of their last answer, the least recently answered forgotten first (~10 MB at
most). A lane keeps its conversation to the end, so at most `clients.concurrency` are under way: those are the
most recent, and the forgotten ones are finished (one forgotten mid-way would go by its ranking, as resumed)."""


def rendezvous(key: Hashable, url: str) -> int:
    """Highest-random-weight hashing: each key ranks the servers its own way, the same in every worker and
    after a restart, and a server's leaving moves only the keys it ranked first."""
    return int.from_bytes(hashlib.blake2b(f"{key!r}|{url}".encode(), digest_size=8).digest(), "little")


class EndpointPool:
    """The servers of a run; pauses when none is up. An unkeyed request goes to the up endpoint with fewest in
    flight. A keyed one (a conversation: its turn k+1's prompt starts with turn k's prompt and answer, which SGLang's
    radix cache holds only on the server that served turn k) goes to the server of its last answer, else to the
    first server of its rendezvous ranking, skipping those at the load cap: its turns stay where its prefix is
    cached, a server that goes down moves its conversations once (they stay pinned where they went), and another
    worker (stolen or resumed work) ranks the servers as this one did."""

    def __init__(
        self,
        urls: list[str],
        session: aiohttp.ClientSession,
        *,
        unreachable_after_s: float,
        probe_interval_s: float = 1.0,
        verify: Verifier | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.session = session
        self.unreachable_after_s = unreachable_after_s
        self.probe_interval_s = probe_interval_s
        self.verify = verify
        self.stop = stop or asyncio.Event()
        self._changed = asyncio.Event()
        self._all_down_since: float | None = None
        self._turn = 0
        self.outages = 0
        self._pinned: dict[Hashable, Endpoint] = {}

    @property
    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.endpoints)

    @property
    def any_up(self) -> bool:
        return any(e.up and e.disabled is None for e in self.endpoints)

    def down_for_s(self) -> float:
        return 0.0 if self._all_down_since is None else time.monotonic() - self._all_down_since

    def pick(self, key: Hashable | None = None) -> Endpoint | None:
        if len(self.endpoints) == 1:  # the common case, on every request
            only = self.endpoints[0]
            return only if only.up and only.disabled is None else None
        candidates = [e for e in self.endpoints if e.up and e.disabled is None]
        if not candidates:
            return None
        if key is not None:
            mean = (sum(e.in_flight for e in candidates) + 1) / len(candidates)
            pinned = self._pinned.get(key)
            if pinned is not None and pinned.up and pinned.disabled is None:
                if pinned.in_flight < math.ceil(PINNED_LOAD_CAP * mean):
                    return pinned
                # Its server is full: move once, to where the room is (not down the ranking, which would
                # push the next conversation along too), and stay there.
                return min(candidates, key=lambda e: e.in_flight)
            cap = math.ceil(LOAD_CAP * mean)
            ranked = sorted(candidates, key=lambda e: rendezvous(key, e.url), reverse=True)
            return next(e for e in ranked if e.in_flight < cap)  # the cap exceeds the mean: one is under it
        self._turn += 1
        # Fewest in flight; ties rotate so one endpoint does not take every idle slot first.
        n = len(candidates)
        return min(
            (candidates[(self._turn + i) % n] for i in range(n)),
            key=lambda e: e.in_flight,
        )

    def pin(self, key: Hashable, endpoint: Endpoint) -> None:
        """The server that answered `key`: it holds the key's prefix now."""
        self._pinned.pop(key, None)
        self._pinned[key] = endpoint
        if len(self._pinned) > MAX_PINNED:
            del self._pinned[next(iter(self._pinned))]

    async def acquire(self, key: Hashable | None = None) -> Endpoint:
        while True:
            if self.stop.is_set():
                raise Drained()
            endpoint = self.pick(key)
            if endpoint is not None:
                endpoint.in_flight += 1
                return endpoint
            if all(e.disabled for e in self.endpoints):
                raise EndpointsRejected("; ".join(f"{e.url}: {e.disabled}" for e in self.endpoints))
            down = self.down_for_s()
            if down >= self.unreachable_after_s:
                raise ServerUnreachable(
                    f"no server answered for {down:.0f}s (deadline {self.unreachable_after_s:.0f}s): "
                    + ", ".join(e.url for e in self.endpoints)
                )
            self._changed.clear()
            waits = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(self.stop.wait())]
            timeout = min(1.0, self.unreachable_after_s - down)
            _, pending = await asyncio.wait(waits, timeout=max(timeout, 0.01), return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    def release(self, endpoint: Endpoint) -> None:
        endpoint.in_flight -= 1

    def mark_down(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.up:
            endpoint.up = False
            self.outages += 1
            log.warning("server %s is down (%s); pausing its requests until /health answers", endpoint.url, reason)
            if not self.any_up and self._all_down_since is None:
                self._all_down_since = time.monotonic()
        if endpoint.probe is None or endpoint.probe.done():
            endpoint.probe = asyncio.create_task(self._probe_until_up(endpoint))

    def _mark_up(self, endpoint: Endpoint) -> None:
        if not endpoint.up:
            log.warning("server %s is back", endpoint.url)
        endpoint.up = True
        self._all_down_since = None
        self._changed.set()

    async def health(self, endpoint: Endpoint) -> bool:
        """GET /health, which in SGLang runs a one-token generation as /health_generate does (engine/health.py):
        waited for until SGLang gives its own verdict."""
        return await is_healthy(self.session, endpoint.url, "/health")

    async def check(self, endpoint: Endpoint) -> bool:
        """After a reset: is the endpoint still there? If not, it is marked down (the outage is not the
        request's fault)."""
        if await self.health(endpoint):
            return True
        self.mark_down(endpoint, "health check failed after a connection error")
        return False

    async def _probe_until_up(self, endpoint: Endpoint) -> None:
        delay = self.probe_interval_s
        while not self.stop.is_set():
            # Wait first: a server that answers /health but 503s /generate must not be hammered in a loop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
            delay = min(delay * 1.5, 5.0)
            if self.stop.is_set():
                return
            if await self.health(endpoint):
                problem = await self.verify(endpoint) if self.verify else None
                if problem:
                    endpoint.disabled = problem
                    log.error("server %s is not usable for this run: %s", endpoint.url, problem)
                    self._changed.set()
                    return
                self._mark_up(endpoint)
                return

    async def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.probe is not None:
                endpoint.probe.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await endpoint.probe
