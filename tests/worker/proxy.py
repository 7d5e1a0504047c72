"""A counting HTTP proxy between a worker and the simulator: it sees every request the worker sends."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import orjson
from aiohttp import ClientSession, web


class CountingProxy:
    """Forwards every request to `upstream` and records the prompt length of each /generate request."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.generate_lengths: list[int] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/generate":
            self.generate_lengths.append(len(orjson.loads(body)["input_ids"]))
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as reply:
            data = await reply.read()
            return web.Response(status=reply.status, body=data, content_type=reply.content_type)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._session = ClientSession()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            self._started.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        assert self._started.wait(10), "proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            await self._session.close()
            await self._runner.cleanup()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
