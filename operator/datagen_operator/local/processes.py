"""Child processes of a local run: started in their own process group, stopped as a group.

Stopping the group matters for the real SGLang: it runs each tensor-parallel rank's scheduler in a child process
of its own (`sglang::scheduler_TP<n>`, SGLang 0.5.23 sglang/srt/entrypoints/engine.py), and a parent kill alone
leaves them holding GPU memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    """One supervised process with its log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    exits: list[int] = field(default_factory=list)

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group, so stop() reaches every descendant
                env={**os.environ, **(self.env or {})},
            )
        finally:
            log.close()
        self.started_at = time.monotonic()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def last_log_line(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except FileNotFoundError:
            return ""
        return lines[-1][-300:] if lines else ""

    def signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL it."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace_s)
            except TimeoutError:
                self.signal_group(signal.SIGKILL)
                await self.process.wait()
        self.signal_group(signal.SIGKILL)  # leftovers of the group (a TP worker that ignored SIGTERM)
        return self.process.returncode
