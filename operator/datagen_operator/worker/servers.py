"""The run's servers as a worker meets them: /server_info of each at start (waiting for at least one),
and the re-check of a server that comes back, so a restart with other args never feeds this output."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from datagen_operator.engine.client.policy import ServerUnreachable
from datagen_operator.engine.client.pool import Endpoint, EndpointPool
from datagen_operator.engine.client.reads import fetch_server_info
from datagen_operator.output.fingerprint import diff_fingerprints, server_fingerprint

log = logging.getLogger("datagen.worker")


class Stopped(Exception):
    """Told to stop (SIGTERM) before any server answered."""


async def server_infos(
    session: aiohttp.ClientSession, pool: EndpointPool, timeout_s: float, stop: asyncio.Event
) -> dict[str, dict[str, Any]]:
    """/server_info of every endpoint reachable now; waits (up to `timeout_s`) for at least one. The others
    are marked down (their probes bring them back)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        infos: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        answers = await asyncio.gather(
            *(fetch_server_info(session, endpoint.url) for endpoint in pool.endpoints),
            return_exceptions=True,
        )
        for endpoint, answer in zip(pool.endpoints, answers, strict=True):
            if isinstance(answer, BaseException):  # any failure here means 'not reachable yet'
                errors.append(f"{endpoint.url}: {answer or type(answer).__name__}")
            else:
                infos[endpoint.url] = answer
        if infos:
            for endpoint in pool.endpoints:
                if endpoint.url not in infos:
                    pool.mark_down(endpoint, "no /server_info at start")
            return infos
        if stop.is_set():
            raise Stopped()
        if time.monotonic() >= deadline:
            raise ServerUnreachable("no server answered /server_info: " + "; ".join(errors))
        log.info("waiting for a server: %s", "; ".join(errors))
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 5.0)


class ServerCheck:
    """The pool's verifier: re-checks a server that (re)appears against the servers' fingerprint, once
    `expected` is known (met at start)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.expected: dict[str, Any] | None = None

    async def __call__(self, endpoint: Endpoint) -> str | None:
        fingerprint = self.expected
        if fingerprint is None:
            return None
        try:
            info = await fetch_server_info(self.session, endpoint.url)
        except Exception as error:
            return f"no /server_info: {error}"
        changes = diff_fingerprints(fingerprint, server_fingerprint(info))
        return "server changed: " + "; ".join(changes) if changes else None
