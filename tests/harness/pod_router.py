"""A loopback router that answers for the server pods only while they could: one simulator behind it, reached as
`<router>/<namespace>/<pod>/<path>` (the operator's DATAGEN_TEST_SERVER_URLS template `{namespace}/{pod}`,
k8s/server_manifests.py `server_urls`), forwarded only while that pod is Ready (kwok's word for the fake kubelet) and not
being deleted. A pod Kueue preempts is deleted and made anew behind its admission gate: from then on its URL
answers a bare 503 (an outage, as a Service without endpoints) and its requests in flight are cut, as a vanished
pod's connections are, until the pod is Ready again. Without it every run's URL reaches the simulator whatever
happens to its pods, and a preempted run's workers would go on generating.

The router (`PodRouter`) asks an `upstream` function which URL answers for a pod now; the tests' (`ServingPods.to`)
sends every serving pod to one shared simulator, hack/dev-cluster.py's to the simulator it started for that pod."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from collections.abc import Callable
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


Upstream = Callable[[str, str], str | None]
"""The URL answering for (namespace, pod) now; None while that pod would not answer."""


@dataclass
class ServingPods:
    """The server pods that serve now (`serving`), polled every `poll_s` from `cluster` (the test control plane,
    its `resource`) by `selector`. Use as a context manager."""

    cluster: Any
    selector: str
    poll_s: float = 0.2
    live: frozenset[tuple[str, str]] = frozenset()
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def to(self, target: str) -> Upstream:
        """Every serving pod answered by `target`."""
        return lambda namespace, pod: target if (namespace, pod) in self.live else None

    def __enter__(self) -> ServingPods:
        self._poll()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def _poll(self) -> None:
        listed = [p.to_dict() for p in self.cluster.resource("v1", "Pod").get(label_selector=self.selector).items]
        self.live = frozenset((p["metadata"]["namespace"], p["metadata"]["name"]) for p in listed if serving(p))

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._poll()
            except Exception:  # the API server may be stopping; the next poll retries
                continue


@dataclass
class PodRouter:
    """`<url>/<namespace>/<pod>/<path>` forwarded to `upstream(namespace, pod)`; a bare 503 while it is None, and a
    request in flight cut once its pod's upstream changes (the pod went). Use as a context manager;
    `endpoint_template` is the operator's server URL template (DATAGEN_TEST_SERVER_URLS)."""

    upstream: Upstream
    poll_s: float = 0.2
    forwarded: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests forwarded, by (namespace, pod)."""
    refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests answered 503 because the pod was not serving, by (namespace, pod)."""
    cut: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Requests in flight cut because their pod stopped serving, by (namespace, pod)."""
    _socket: socket.socket = field(default_factory=_free_socket)
    _thread: threading.Thread | None = None
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
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="pod-router", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the pod router did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._router_stop is not None:
            self._loop.call_soon_threadsafe(self._router_stop.set)
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._socket.close()

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._router(ready))
        self._loop.close()

    async def _router(self, ready: threading.Event) -> None:
        self._router_stop = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)  # streams last as long as generation
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
        target = self.upstream(*key)
        if target is None:
            self.refused[key] += 1
            return web.Response(status=503, text=f"server pod {key[0]}/{key[1]} is not serving\n")
        self.forwarded[key] += 1
        proxy = asyncio.ensure_future(self._proxy(request, target))
        while not proxy.done():
            await asyncio.wait({proxy}, timeout=self.poll_s)
            if not proxy.done() and self.upstream(*key) != target:
                # The pod went (deleted, no longer Ready): its connections drop, mid-answer or before it.
                self.cut[key] += 1
                proxy.cancel()
                if request.transport is not None:
                    request.transport.close()
                return web.Response(status=503)
        return proxy.result()

    async def _proxy(self, request: web.Request, target: str) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in UNFORWARDED_HEADERS}
        session = request.app[SESSION]
        url = f"{target}/{request.match_info['path']}"
        response: web.StreamResponse | None = None
        try:
            async with session.request(
                request.method, url, params=request.query, data=await request.read(), headers=headers
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in UNFORWARDED_HEADERS:
                        response.headers[name] = value
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (TimeoutError, aiohttp.ClientConnectionError):
            if response is not None and response.prepared:
                raise  # mid-stream: the client sees the connection drop, as from a vanished pod
            return web.Response(status=503, text=f"{target}: no answer (its server stopped)\n")
