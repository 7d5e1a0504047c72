"""A loopback router that answers for the server pods only while they could: one simulator behind it, reached as
`<router>/<namespace>/<pod>/<path>` (the operator's DATAGEN_TEST_SERVER_URLS template `{namespace}/{pod}`,
k8s/server_manifests.py `server_urls`), forwarded only while that pod is Ready (kwok's word for the fake kubelet) and not
being deleted. A pod Kueue preempts is deleted and made anew behind its admission gate: from then on its URL
answers a bare 503 (an outage, as a Service without endpoints) and its requests in flight are cut, as a vanished
pod's connections are, until the pod is Ready again. Without it every run's URL reaches the simulator whatever
happens to its pods, and a preempted run's workers would go on generating.

As hack/dev-cluster.py's router, without a simulator per pod: the tests share one."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

HOST = "127.0.0.1"
UNFORWARDED_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)
"""Hop-by-hop and framing headers: aiohttp sets its own on each side of the router."""
SESSION = web.AppKey("session", aiohttp.ClientSession)


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def serving(pod: dict[str, Any]) -> bool:
    """A pod that would answer: Ready, and not being deleted."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class PodRouter:
    """`cluster`: the test control plane (its `resource`); `target`: the simulator's URL; `selector`: the server
    pods' label selector. Use as a context manager; `endpoint_template` is the operator's server URL template."""

    cluster: Any
    target: str
    selector: str
    poll_s: float = 0.2
    forwarded: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests forwarded, by (namespace, pod)."""
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests answered 503 because the pod was not serving, by (namespace, pod)."""
    cut: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests in flight cut because their pod stopped serving, by (namespace, pod)."""
    _live: frozenset[tuple[str, str]] = frozenset()
    _socket: socket.socket = field(default_factory=_free_socket)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _router_stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._socket.getsockname()[1]}"

    @property
    def endpoint_template(self) -> str:
        return self.url + "/{namespace}/{pod}"

    def __enter__(self) -> PodRouter:
        ready = threading.Event()
        self._watch_once()
        for target, args in ((self._serve, (ready,)), (self._watch, ())):
            thread = threading.Thread(target=target, args=args, daemon=True)
            thread.start()
            self._threads.append(thread)
        if not ready.wait(30):
            raise RuntimeError("the pod router did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._loop is not None and self._router_stop is not None:
            self._loop.call_soon_threadsafe(self._router_stop.set)
        for thread in self._threads:
            thread.join(timeout=15)
        self._socket.close()

    def live(self, namespace: str, pod: str) -> bool:
        return (namespace, pod) in self._live

    # --- which pods serve -------------------------------------------------------------------------

    def _watch_once(self) -> None:
        pods = self.cluster.resource("v1", "Pod").get(label_selector=self.selector).items
        listed = [p.to_dict() for p in pods]
        self._live = frozenset((p["metadata"]["namespace"], p["metadata"]["name"]) for p in listed if serving(p))

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._watch_once()
            except Exception:  # the API server may be stopping; the next poll retries
                continue

    # --- the router -------------------------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._router(ready))
        self._loop.close()

    async def _router(self, ready: threading.Event) -> None:
        self._router_stop = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app[SESSION] = session
            app.router.add_route("*", "/{namespace}/{pod}/{path:.*}", self._forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.SockSite(runner, self._socket).start()
            ready.set()
            await self._router_stop.wait()
            await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        key = (request.match_info["namespace"], request.match_info["pod"])
        if key not in self._live:
            self.refused[key] += 1
            return web.Response(status=503, text=f"server pod {key[0]}/{key[1]} is not serving\n")
        self.forwarded[key] += 1
        proxy = asyncio.ensure_future(self._proxy(request))
        while not proxy.done():
            await asyncio.wait({proxy}, timeout=self.poll_s)
            if not proxy.done() and key not in self._live:
                # The pod went (deleted, no longer Ready): its connections drop, mid-answer or before it.
                self.cut[key] += 1
                proxy.cancel()
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=503)
        return proxy.result()

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in UNFORWARDED_HEADERS}
        session = request.app[SESSION]
        url = f"{self.target}/{request.match_info['path']}"
        body = await request.read()
        async with session.request(request.method, url, params=request.query, data=body, headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in UNFORWARDED_HEADERS:
                    response.headers[name] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
