"""Run `datagen sim-server` (the SGLang simulator) as a subprocess for tests and benchmarks.

Stable API (other test suites import it):

    from tests.harness.sim import start_sim

    with start_sim("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2") as sim:
        sim.url            # "http://127.0.0.1:<port>", the server is answering /health 200
        sim.port, sim.pid  # loopback port (picked free by the server) and process id
        sim.restart()      # stop, then start again with the same flags on the same port
        sim.stop()         # SIGTERM to its process group, SIGKILL after a grace period; returns the exit code

`start_sim(*flags, tokenizer_dir=None, wait_ready=True, timeout_s=60.0, env=None) -> SimServer`
 - `flags` are `datagen sim-server` flags (SGLang's and `--sim-*`); do not pass --host/--port.
 - `tokenizer_dir` is passed as `--model-path` (default: the cached stand-in tokenizer).
 - `wait_ready=False` returns once the server listens (for tests of `--sim-load-seconds`, where /health is 503).
 - The server runs in its own process group, started as
   `[sys.executable, "-m", "datagen_operator.cli", "sim-server", ...]`; its output goes to `sim.log_path`
   (`sim.log_text()`), which failure messages include.
 - `SimServer.wait_exit(timeout_s)` returns the exit code of a server expected to exit by itself
   (`--sim-crash-after-requests`); `sim.running` tells whether the process is alive.
 - `start_sims([flags, ...])` starts several servers in parallel (start-up overlaps) and stops them all.

Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

from tests.harness.processes import wait_until

HOST = "127.0.0.1"


class SimStartError(RuntimeError):
    pass


def health_status(url: str, timeout_s: float = 5.0) -> int | None:
    """HTTP status of GET {url}/health, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


class SimServer:
    """One simulator process; see the module docstring."""

    def __init__(
        self,
        flags: Sequence[str],
        *,
        tokenizer_dir: Path | None = None,
        env: dict[str, str] | None = None,
        port: int = 0,
        workdir: Path | None = None,
    ) -> None:
        self.flags = tuple(flags)
        self.tokenizer_dir = tokenizer_dir
        self.env = env
        self.port = port
        # Holds the log and the port file; a fresh temporary folder unless the caller keeps its own.
        self._workdir = workdir or Path(tempfile.mkdtemp(prefix="datagen-sim-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self._workdir / "sim.log"
        self._process: subprocess.Popen[bytes] | None = None

    # -- process control -------------------------------------------------------------------------
    def command(self) -> list[str]:
        command = [sys.executable, "-m", "datagen_operator.cli", "sim-server", "--host", HOST]
        command += ["--port", str(self.port), "--sim-port-file", str(self._port_file)]
        if self.tokenizer_dir is not None:
            command += ["--model-path", str(self.tokenizer_dir)]
        return command + list(self.flags)

    @property
    def _port_file(self) -> Path:
        return self._workdir / "port"

    def spawn(self) -> SimServer:
        """Start the process without waiting (see `wait_listening` / `wait_ready`)."""
        if self.running:
            raise SimStartError("the simulator is already running")
        self._port_file.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        return self

    def wait_listening(self, timeout_s: float = 60.0) -> None:
        wait_until(
            self._port_file.is_file, timeout=timeout_s, describe="sim-server listening", watched=self._watched(),
            interval=0.02, details=self.log_text, failure=SimStartError,
        )  # fmt: skip
        self.port = int(self._port_file.read_text().strip())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait for the port, then for /health 200."""
        started = time.monotonic()
        self.wait_listening(timeout_s)
        wait_until(
            lambda: health_status(self.url) == 200, timeout=timeout_s - (time.monotonic() - started),
            describe="sim-server /health 200", watched=self._watched(), interval=0.05, details=self.log_text,
            failure=SimStartError,
        )  # fmt: skip

    def _watched(self) -> list[subprocess.Popen[bytes]]:
        return [self._process] if self._process is not None else []

    def terminate(self) -> None:
        """Send SIGTERM to the process group without waiting (see `stop`)."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `timeout_s`; the exit code (None if never started)."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            self.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout_s)
        return process.returncode

    def restart(self, *, wait_ready: bool = True, timeout_s: float = 60.0) -> SimServer:
        """Stop (if running) and start again with the same flags on the same port."""
        self.stop()
        self.spawn()
        if wait_ready:
            self.wait_ready(timeout_s)
        else:
            self.wait_listening(timeout_s)
        return self

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        if self._process is None:
            raise SimStartError("the simulator was never started")
        return self._process.wait(timeout_s)

    # -- facts -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise SimStartError("the simulator was never started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def __enter__(self) -> SimServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def start_sim(
    *flags: str,
    tokenizer_dir: Path | None = None,
    wait_ready: bool = True,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> SimServer:
    """Start a simulator on a free loopback port; use as a context manager (or call `.stop()`)."""
    server = SimServer(flags, tokenizer_dir=tokenizer_dir, env=env).spawn()
    try:
        if wait_ready:
            server.wait_ready(timeout_s)
        else:
            server.wait_listening(timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def start_sims(
    flag_sets: Sequence[Sequence[str]], *, tokenizer_dir: Path | None = None, timeout_s: float = 60.0
) -> Iterator[list[SimServer]]:
    """Several simulators started in parallel, ready on entry, all stopped on exit."""
    servers = [SimServer(flags, tokenizer_dir=tokenizer_dir) for flags in flag_sets]
    try:
        for server in servers:
            server.spawn()
        for server in servers:
            server.wait_ready(timeout_s)
        yield servers
    finally:
        for server in servers:  # signal all first: they shut down in parallel
            server.terminate()
        for server in servers:
            server.stop()
