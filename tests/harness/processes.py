"""Child processes for the test control plane: own process group, output in a log file, stopped
without orphans (SIGTERM to the group, SIGKILL after a grace period, and the kernel's parent-death
signal if pytest itself is killed), plus the polling helper every start-up wait uses."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used; the message says why and where the logs are."""


_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child between fork and exec should only make the one system call.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    # Runs in the child before exec: if pytest is killed outright (no atexit), the kernel still kills
    # the component, so no etcd or apiserver outlives the test session.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ManagedProcess:
    """A child in its own process group, its output in a log file; stop() ends the whole group."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]

    @classmethod
    def start(
        cls, name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        log_path = log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                # The signal follows the *thread* that started the child, so only the main one asks.
                preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        process = cls(name, list(argv), log_path, popen)
        _LIVE_PROCESSES.append(process)
        return process

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_seconds: float = 10.0) -> None:
        """Idempotent: once stopped, the group id may belong to someone else, so never signal it again."""
        if self not in _LIVE_PROCESSES:
            return
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace_seconds)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        # Children it forked share the group; make sure none survives the leader.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        _LIVE_PROCESSES.remove(self)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return tail(self.log_path.read_text(errors="replace"), lines)
        except FileNotFoundError:
            return "(no log)"


_LIVE_PROCESSES: list[ManagedProcess] = []


@atexit.register
def _stop_leftover_processes() -> None:
    # Safety net for sessions that end without fixture teardown (KeyboardInterrupt, internal errors).
    for process in reversed(list(_LIVE_PROCESSES)):
        process.stop(grace_seconds=3)


def tail(text: str, lines: int) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout: float,
    describe: str,
    watched: Iterable[ManagedProcess | subprocess.Popen[Any]] = (),
    interval: float = 0.2,
    details: Callable[[], str] = lambda: "",
    failure: type[Exception] = ControlPlaneError,
) -> T:
    """The one wait of the tests and the harness: polls until `condition` returns something truthy and returns
    it; fails early if a watched process exited, and on timeout, each time naming `describe`, the last exception
    `condition` raised and `details()` (a log tail, the objects seen), as a `failure`. An exception from `condition` is retried (a
    server not answering yet), except an AssertionError: a test's invariant broken while waiting fails at once."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except AssertionError:
            raise
        except Exception as error:  # the last one explains a timeout
            last_error = error
        for process in watched:
            if isinstance(process, ManagedProcess) and not process.alive():
                raise failure(
                    f"{process.name} exited with {process.popen.returncode} while waiting for {describe}; "
                    f"log {process.log_path}:\n{process.log_tail()}"
                )
            if isinstance(process, subprocess.Popen) and process.poll() is not None:
                raise failure(
                    f"pid {process.pid} ({process.args!r:.200}) exited with {process.returncode} while waiting for "
                    f"{describe}\n{details()}"
                )
        if time.monotonic() > deadline:
            last = f": {last_error}" if last_error else ""
            raise failure(f"timed out after {timeout:.0f} s waiting for {describe}{last}\n{details()}")
        time.sleep(interval)
