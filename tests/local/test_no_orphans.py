"""A `datagen run` killed with SIGKILL leaves nothing running: its simulator and workers die with it, and a later
`datagen run` of the same output stops whatever an earlier one left (a child without the death signal) before
it generates, so no record is written twice."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.harness.processes import wait_until
from tests.local.runs import FAST_SIM, SLOW_SIM, datagen_run, dataset_ids, manifest, start_generating, stored_keys


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name; None for a process that is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def _process(pid: int) -> tuple[int, str, str] | None:
    """(pid, start time, command line): the same process only while all three hold."""
    fields = _stat(pid)
    if fields is None:
        return None
    with contextlib.suppress(OSError):
        return pid, fields[19], Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return None


def _running(processes: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    return [p for p in processes if (_stat(p[0]) or [""] * 20)[19] == p[1]]


def _children(parent: int) -> list[tuple[int, str, str]]:
    """Every process whose parent is `parent`, read from /proc (not from anything the run writes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and int(fields[1]) == parent:
            process = _process(int(entry.name))
            if process is not None:
                found.append(process)
    return found


def _kill_groups(processes: list[tuple[int, str, str]]) -> None:
    """What a failing test leaves is not left on the machine."""
    for pid, _, _ in _running(processes):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def test_kill_9_of_datagen_run_takes_its_simulator_and_workers_with_it(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": 2})
    run = start_generating(run_file, tmp_path / "out")
    children = _children(run.pid)
    try:
        commands = [command for _, _, command in children]
        assert any(" sim-server " in c for c in commands), commands
        assert sum(" worker " in c for c in commands) == 2, commands

        run.kill()
        run.communicate(timeout=30)
        wait_until(
            lambda: not _running(children), timeout=5, describe="every child gone after kill -9 of datagen run",
            interval=0.1, details=lambda: f"still running: {_running(children)}",
        )  # fmt: skip
    finally:
        run.kill()
        _kill_groups(children)


LEFTOVERS = """
import subprocess, sys, time, urllib.request
from pathlib import Path
from datagen_operator.api import load_run
from datagen_operator.local.processes import free_port, record_processes
from datagen_operator.local.runner import LocalRunner
from datagen_operator.output.layout import OutputLayout

out = Path(sys.argv[1])
runner = LocalRunner(load_run(OutputLayout(out).run_file), out, simulator=True, sim_args=sys.argv[2:])
port = free_port()
log = (out / "logs" / "leftover.log").open("ab")
server = subprocess.Popen(runner.servers.argv(port), start_new_session=True, stdout=log, stderr=log)
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
url = f"http://127.0.0.1:{port}"
worker = subprocess.Popen(runner.worker_argv(0, [url]), start_new_session=True, stdout=log, stderr=log)
record_processes(out, [("server-0", server.pid), ("worker-0", worker.pid)])
print(server.pid, worker.pid)
"""
"""A `datagen run` whose children lack the death signal (an older datagen, another OS): it starts a simulator and
shard 0's worker on it, names them in the output as the runner does, and exits, leaving them generating."""


def test_a_later_run_stops_what_an_earlier_killed_run_left_running(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": 2})
    out = tmp_path / "out"
    first = start_generating(run_file, out)
    first_children = _children(first.pid)
    first.kill()
    first.communicate(timeout=30)

    left_by = subprocess.run(
        [sys.executable, "-c", LEFTOVERS, str(out), *(arg.removeprefix("--sim-arg=") for arg in SLOW_SIM)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    pids = [int(word) for word in left_by.stdout.split()]
    leftovers = [p for pid in pids if (p := _process(pid)) is not None]
    try:
        assert len(leftovers) == 2, f"the leftovers did not start: {left_by.stdout}{left_by.stderr}"
        segments = list(out.glob("shards/00000/segment-*.jsonl"))
        lines = sum(path.read_bytes().count(b"\n") for path in segments)
        wait_until(
            lambda: sum(p.read_bytes().count(b"\n") for p in out.glob("shards/00000/segment-*.jsonl")) > lines,
            timeout=60, describe="a record from the leftover worker",
        )  # fmt: skip

        assert _running(leftovers) == leftovers, "the leftovers are still generating when the next run starts"
        again = datagen_run(run_file, *FAST_SIM)
        said = " ".join(again.stdout.split())
        assert again.returncode == 0, said
        assert not _running(leftovers), f"the leftovers of the killed run still run: {_running(leftovers)}"
        assert "stopped 2 processes left running by an earlier datagen run" in said, said
        assert f"server-0 (pid {pids[0]}), worker-0 (pid {pids[1]})" in said
        keys = stored_keys(out)
        assert sorted(keys) == sorted((i, 0) for i in dataset_ids()), "every record once, none twice"
        assert not (out / "processes.json").exists(), "a finished run leaves no process to stop"
    finally:
        _kill_groups(leftovers + first_children)
