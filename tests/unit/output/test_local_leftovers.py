"""Which processes a later `datagen run` stops: only children of a recorded run that is gone, each known by pid
AND start time, so a pid the kernel has given to another process since is never signalled."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import orjson

from datagen_operator.local.processes import ProcessId, RunProcesses, record_processes, stop_leftovers
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import Holder, read_lease, take_lease


def _recorded(output: Path, **changes: object) -> RunProcesses:
    recorded = RunProcesses.read(output)
    assert recorded is not None
    changed = replace(recorded, **changes)  # type: ignore[arg-type]
    document = orjson.loads(OutputLayout(output).processes.read_bytes())
    document["owner"] = vars(changed.owner)
    document["children"] = [vars(child) for child in changed.children]
    OutputLayout(output).processes.write_bytes(orjson.dumps(document))
    return changed


def test_children_of_a_gone_run_are_stopped_and_its_lease_given_back(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record_processes(tmp_path, [("worker-0", sleeper.pid), ("server-0", os.getpid())])
        me = ProcessId.of(os.getpid())
        assert me is not None
        # The owner's pid is this test's now (a recycled pid): its start time says it is another process.
        recorded = _recorded(
            tmp_path,
            owner=replace(me, start=me.start - 1),
            children=(ProcessId.of(sleeper.pid, "worker-0"), replace(me, start=me.start - 1, name="server-0")),
        )
        take_lease(tmp_path, Holder.parse(recorded.holder_id, "the killed run"), 3600)

        stopped = stop_leftovers(tmp_path, grace_s=5)

        assert [child.name for child in stopped] == ["worker-0"]
        assert sleeper.wait(timeout=5) is not None
        assert read_lease(tmp_path) is None, "the gone run's lease is not waited out"
        assert ProcessId.of(os.getpid()) == me, "a pid recorded with another start time is not signalled"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_children_of_a_live_run_are_left_to_the_lease(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record_processes(tmp_path, [("worker-0", sleeper.pid)])
        take_lease(tmp_path, Holder.this_process("live"), 3600)
        assert stop_leftovers(tmp_path) == []
        assert sleeper.poll() is None
        lease = read_lease(tmp_path)
        assert lease is not None and lease.holder == f"local:{socket.gethostname()}:{os.getpid()}"
    finally:
        sleeper.kill()
        sleeper.wait()
