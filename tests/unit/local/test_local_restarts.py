"""The local runner restarts a server process by control/policy.py's restart policy: after its back-off, at
most SERVER_RESTARTS times, then the run gives up (no rule of its own)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from datagen_operator.api import parse_run
from datagen_operator.control.policy import SERVER_RESTARTS, server_restart_delay_s
from datagen_operator.local.processes import Child
from datagen_operator.local.runner import LocalRunner
from tests.manifests import local_run


class PaperServer(Child):
    """A server process on paper: a start is counted and sets it running; `exit()` ends it."""

    starts: int = 0
    up: bool = False

    @property
    def running(self) -> bool:
        return self.up

    async def start(self) -> None:
        self.starts += 1
        self.up = True

    def exit(self) -> None:
        self.up = False


def test_an_exited_server_is_restarted_after_its_back_off_until_the_policy_gives_up(tmp_path: Path) -> None:
    run = parse_run(local_run(tmp_path / "model", tmp_path / "d.jsonl", tmp_path / "out"))
    runner = LocalRunner(run, tmp_path / "out", simulator=True)
    server = PaperServer("server-0", [], tmp_path / "server.log")
    runner.servers.children = [(server, "http://127.0.0.1:1")]

    def observe() -> str | None:
        (instance,) = asyncio.run(runner.servers.observe(None, stopping=False)).instances
        return instance.waiting_reason

    for restarts in range(SERVER_RESTARTS):
        server.exit()
        assert observe() == "CrashLoopBackOff"
        assert server.starts == restarts, "not before its back-off"
        delay = server_restart_delay_s(restarts)
        assert delay is not None
        runner.servers.exits[0] = time.monotonic() - delay  # the back-off has passed
        observe()
        assert (server.starts, server.restarts) == (restarts + 1, restarts + 1)
        assert not runner.servers.gave_up()
    server.exit()
    observe()
    runner.servers.exits[0] = time.monotonic() - 3600
    observe()
    assert server.starts == SERVER_RESTARTS and runner.servers.gave_up()
