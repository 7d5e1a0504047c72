"""Child processes of a local run: started in their own process group, stopped as a group, and never outliving it.

Stopping the group matters for the real SGLang: it runs each tensor-parallel rank's scheduler in a child process
of its own (`sglang::scheduler_TP<n>`, SGLang 0.5.23 sglang/srt/entrypoints/engine.py), and a parent kill alone
leaves them holding GPU memory.

A `kill -9` of `datagen run` runs none of its own code, so two things stand in for it:
- each child is started with the Linux parent-death signal (SIGKILL), the way SGLang binds its own scheduler and
  detokenizer processes to the server (`kill_itself_when_parent_died`, sglang/srt/utils/common.py): once the
  server's process dies, its TP ranks follow;
- `processes.json` in the output names the run and its children by pid and start time; a later `datagen run` on
  the same output stops the children of a run that is gone (`stop_leftovers`), since a child whose death signal
  could not be set (another OS, an older datagen) would otherwise keep generating into the output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import Holder, release_lease

DATAGEN = (sys.executable, "-m", "datagen_operator.cli")
"""How a child runs `datagen`: this interpreter (its environment), whatever `datagen` is on the PATH."""

LEFTOVER_GRACE_S = 5.0
"""How long a leftover gets to end on SIGTERM before its group is killed: nothing reads what it does any more."""

_DEATH_SIGNAL_WRAPPER = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG = 1; kept across the exec below
    "if os.getppid() != int(sys.argv[1]):\n"  # the run died before the signal was set: end here
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Sets the parent-death signal, then becomes the child's program (same pid). A wrapper rather than a
`preexec_fn`: Python code between fork and exec can deadlock in a process with threads, and the run has some."""


def with_death_signal(argv: list[str]) -> list[str]:
    """`argv` started so that it is SIGKILLed when this process dies (Linux; elsewhere `argv` unchanged).

    The kernel sends the signal when the *thread* that forked exits: children are started from the event loop's
    thread, which lives until the run has stopped them all."""
    if sys.platform != "linux":
        return argv
    return [sys.executable, "-I", "-S", "-c", _DEATH_SIGNAL_WRAPPER, str(os.getpid()), *argv]


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
                *with_death_signal(self.argv),
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


# --- what a run leaves in its output: its processes, so a later run can stop them ------------------------------


@dataclass(frozen=True)
class ProcessId:
    """A process of this machine by pid AND start time: a pid the kernel gave to another process since is
    never taken for it."""

    pid: int
    start: int
    """Clock ticks after boot (field 22 of /proc/<pid>/stat)."""
    name: str = ""

    @classmethod
    def of(cls, pid: int, name: str = "") -> ProcessId | None:
        start = _start_ticks(pid)
        return None if start is None else cls(pid, start, name)

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start


def _start_ticks(pid: int) -> int | None:
    """When a live process started, None when there is none (a zombie counts as gone: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class RunProcesses:
    """`OUTPUT/processes.json`: the `datagen run` that owns the output's processes and its children."""

    host: str
    boot: str
    owner: ProcessId
    children: tuple[ProcessId, ...]

    @classmethod
    def read(cls, output: Path) -> RunProcesses | None:
        try:
            data = orjson.loads(OutputLayout(output).processes.read_bytes())
            return cls(
                data["host"],
                data["boot"],
                ProcessId(**data["owner"]),
                tuple(ProcessId(**child) for child in data["children"]),
            )
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            return None  # none, or torn: nothing this run can trust to stop

    @property
    def holder_id(self) -> str:
        """The lease holder id the owner's steps wrote (output/lease.py, Holder.this_process)."""
        return f"local:{self.host}:{self.owner.pid}"

    def here(self) -> bool:
        return self.host == socket.gethostname() and self.boot == _boot_id()


def record_processes(output: Path, children: Iterable[tuple[str, int]]) -> None:
    """Name this process and its running `children` (name, pid) in the output, replacing what was there."""
    owner = ProcessId.of(os.getpid(), "datagen run")
    if owner is None:  # no /proc (not Linux): no start time to tell a pid's process from a later one
        return
    alive = [child for name, pid in children if (child := ProcessId.of(pid, name)) is not None]
    document = {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "owner": asdict(owner),
        "children": [asdict(child) for child in alive],
    }
    staging = output / f".{OutputLayout(output).processes.name}.{os.getpid()}.tmp"
    staging.write_bytes(orjson.dumps(document))
    os.replace(staging, OutputLayout(output).processes)


def forget_processes(output: Path) -> None:
    """At the end of this run: its children are stopped; a file of another (live) owner is left alone."""
    recorded = RunProcesses.read(output)
    if recorded is not None and recorded.owner == ProcessId.of(os.getpid(), "datagen run"):
        with contextlib.suppress(FileNotFoundError):
            OutputLayout(output).processes.unlink()


def leftovers(output: Path) -> tuple[RunProcesses | None, list[ProcessId]]:
    """The record of an earlier run of `output` that is gone, and its children still running; (None, []) when
    there is none, or its run is alive (a second run on one output is the lease's to refuse, not to kill)."""
    recorded = RunProcesses.read(output)
    if recorded is None or not recorded.here() or recorded.owner.alive():
        return None, []
    return recorded, [child for child in recorded.children if child.alive()]


def stop_leftovers(output: Path, grace_s: float = LEFTOVER_GRACE_S) -> list[ProcessId]:
    """Stop the children an earlier, dead `datagen run` of `output` left running (their whole process groups:
    a server's TP ranks too), SIGTERM then SIGKILL after `grace_s`; returns those found running."""
    recorded, running = leftovers(output)
    for child in running:
        _signal_leftover(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(child.alive() for child in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for child in running:
        _signal_leftover(child, signal.SIGKILL)
    if recorded is not None:  # its lease, renewed by those children, is nobody's now: not waited out
        release_lease(output, Holder.parse(recorded.holder_id, recorded.holder_id))
    return running


def _signal_leftover(child: ProcessId, sig: int) -> None:
    """The child's group (it leads one: start_new_session). Its pid cannot lead another group while the old one
    has members (the kernel keeps a group's id in use), so the group is signalled when the leader is still
    that child, or gone with no other process holding its pid."""
    leader = _start_ticks(child.pid)
    if leader is not None and leader != child.start:
        return  # the pid is another process's now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)
