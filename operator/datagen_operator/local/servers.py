"""The run's servers on one machine: its replicas as child processes on 127.0.0.1 (SGLang, or the simulator where
there is no GPU or no sglang), restarted after control/policy.py's back-off; or server.external's URLs, only probed.
Observed as the operator observes its server pods (`ServerObservation`), so control.decide judges both alike."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.control.observed import ServerInstance, ServerObservation
from datagen_operator.control.policy import server_restart_delay_s
from datagen_operator.engine.launch import server_argv
from datagen_operator.local.processes import DATAGEN, Child, free_port

SERVER_GRACE_S = 15.0


def gpus_available() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def real_sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None and gpus_available()


@dataclass
class LocalServers:
    spec: DataGenRunSpec
    resolved: ResolvedModel
    simulator: bool
    sim_args: list[str]
    logs: Path
    start_child: Callable[[Child], Awaitable[None]]
    """Starts a child and names it in the output's processes.json (the runner's: it knows the workers too)."""
    children: list[tuple[Child, str]] = field(default_factory=list)
    """Each replica's process and its URL."""
    exits: dict[int, float] = field(default_factory=dict)
    """When each server that exited was first seen down (monotonic): its restart waits out the back-off."""
    external_urls: list[str] = field(init=False)
    """server.external's URLs (`datagen run` takes urls only: main.py refuses a Service): never started here."""
    external_ready: list[str] = field(default_factory=list)
    external_unanswered_since: float | None = None

    def __post_init__(self) -> None:
        external = self.spec.server.external
        self.external_urls = [url.rstrip("/") for url in external.urls or ()] if external is not None else []

    def argv(self, port: int) -> list[str]:
        """A server replica on 127.0.0.1:`port`: SGLang, or the simulator."""
        argv = server_argv(self.spec, host="127.0.0.1", port=port, python=sys.executable, resolved=self.resolved)
        if self.simulator:
            # The simulator takes sglang.launch_server's own flags: only the program differs.
            argv = [*DATAGEN, "sim-server", *argv[3:], *self.sim_args]
        return argv

    async def start(self) -> None:
        for index in range(self.spec.server.replicas):
            port = free_port()
            child = Child(f"server-{index}", self.argv(port), self.logs / f"server-{index}.log")
            self.children.append((child, f"http://127.0.0.1:{port}"))
            await self.start_child(child)

    async def observe(self, session: Any, *, stopping: bool) -> ServerObservation:
        """Each replica's health; one that exited is restarted once its back-off has passed (not while stopping)."""
        from datagen_operator.engine.client.reads import is_healthy

        instances = []
        for index, (child, url) in enumerate(self.children):
            name = f"server-{index}"
            if child.running:
                ready = await is_healthy(session, url)
                loading = None if ready else time.monotonic() - child.started_at
                instances.append(
                    ServerInstance(
                        name, running=True, ready=ready, restarts=child.restarts, loading_seconds=loading, endpoint=url
                    )
                )
                continue
            last_exit = f"exit {child.returncode}: {child.last_log_line()}"
            instances.append(
                ServerInstance(name, restarts=child.restarts, last_exit=last_exit, waiting_reason="CrashLoopBackOff")
            )
            delay = server_restart_delay_s(child.restarts)
            exited_at = self.exits.setdefault(index, time.monotonic())
            if delay is not None and time.monotonic() - exited_at >= delay and not stopping:
                del self.exits[index]
                child.restarts += 1
                await self.start_child(child)
        return ServerObservation(self.spec.server.replicas, tuple(instances))

    async def observe_external(self, session: Any) -> ServerObservation:
        """server.external: each URL probed; `loading_seconds` counts from when none answered first."""
        from datagen_operator.engine.client.reads import is_healthy

        answers = await asyncio.gather(*(is_healthy(session, url) for url in self.external_urls))
        self.external_ready = [url for url, ok in zip(self.external_urls, answers, strict=True) if ok]
        now = time.monotonic()
        if self.external_ready:
            self.external_unanswered_since = None
        elif self.external_unanswered_since is None:
            self.external_unanswered_since = now
        since = self.external_unanswered_since
        waited = None if since is None else now - since
        instances = tuple(
            ServerInstance(url, running=True, ready=ok, loading_seconds=None if ok else waited, endpoint=url)
            for url, ok in zip(self.external_urls, answers, strict=True)
        )
        return ServerObservation(len(instances), instances, external=True)

    def gave_up(self) -> bool:
        return any(not c.running and server_restart_delay_s(c.restarts) is None for c, _ in self.children)

    def ready_urls(self) -> list[str]:
        if self.external_urls:
            return self.external_ready
        return [url for child, url in self.children if child.running]

    async def stop(self) -> None:
        await asyncio.gather(*(child.stop(SERVER_GRACE_S) for child, _ in self.children))
        self.children = []
        self.exits.clear()
