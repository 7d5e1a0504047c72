"""One owner per output: a lease file in the output directory, so two runs never generate into one output.

Two DataGenRuns with the same volume and path (other namespaces, identical specs), or two `datagen run` on one
directory, would otherwise both run: two servers, every prompt generated twice, the shards racing in compaction.
The preflight takes the lease before any server, the canary and the workers take it again (renewing it while
they run); a step of another run finds it held and is refused naming the holder (`OutputInUse`).

`lease.json` names the holder (a run's UID in a cluster, `local:<host>:<pid>` for `datagen run`), the run to name
in a refusal, and when it expires. A lease is stale once expired, or at once when its holder is a process of
this host that is gone; a stale lease is taken over. Every take, renewal and release reads, decides and writes
under a lock directory (`mkdir` is atomic on any filesystem, NFS included), so of two takers racing exactly one
holds the lease, and an expired holder cannot renew over the run that took its output over.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

import orjson

from datagen_operator.api.commands import ReleaseLeaseCommand
from datagen_operator.api.spec import DataGenRun
from datagen_operator.api.step_program import add_shared_arguments
from datagen_operator.output.layout import OutputLayout

WORKER_LEASE_S = 300.0
"""How long a worker's lease lasts; workers renew it every progress interval, far more often."""
LEASE_RENEW_S = 30.0
STEP_MARGIN_S = 1800.0
"""Beyond the server's startup budget, how long the preflight's lease lasts: the canary takes it next."""
LOCK_WAIT_S = 10.0
LOCK_STALE_S = 30.0


@dataclass(frozen=True)
class Holder:
    id: str
    """The run's UID in a cluster, `local:<host>:<pid>` for `datagen run`."""
    run: str
    """What a refusal names: `namespace/name` or `datagen run <manifest>`."""
    host: str | None = None
    pid: int | None = None
    """For a local holder: its process, so a lease of a run that is gone is taken over at once."""

    @classmethod
    def this_process(cls, run_name: str) -> Holder:
        """`datagen run` itself: its workers (child processes) hold the lease under the same id."""
        return cls.parse(f"local:{socket.gethostname()}:{os.getpid()}", run_name)

    @classmethod
    def parse(cls, text: str, run_name: str) -> Holder:
        """A holder from its id, as the step command lines pass it (`--lease-holder`)."""
        parts = text.split(":")
        if len(parts) == 3 and parts[0] == "local" and parts[2].isdigit():
            host, pid = parts[1], int(parts[2])
            return cls(text, f"datagen run {run_name} (pid {pid} on {host})", host, pid)
        return cls(text, run_name)


@dataclass(frozen=True)
class Lease:
    holder: str
    run: str
    host: str | None
    pid: int | None
    renewed_at: float
    expires_at: float
    step: str | None = None
    """Who took it last: STEP_PREFLIGHT, STEP_WORKERS or STEP_LOCAL_RUN (None: a lease written before it was
    recorded)."""

    def stale(self, now: float) -> bool:
        if now >= self.expires_at:
            return True
        return self.host == socket.gethostname() and self.pid is not None and not _alive(self.pid)


STEP_PREFLIGHT = "preflight"
STEP_WORKERS = "workers"
STEP_LOCAL_RUN = "run"

_DOING = {
    STEP_PREFLIGHT: "taken by its preflight, and held through its server's start and its canary; its workers take it "
    f"next, renew it every {LEASE_RENEW_S:.0f} s and give it back when the run's shards are all done",
    STEP_WORKERS: f"its workers are generating: they renew it every {LEASE_RENEW_S:.0f} s and give it back when the "
    "run's shards are all done",
    STEP_LOCAL_RUN: f"held by that process for its whole run (its workers renew it every {LEASE_RENEW_S:.0f} s); it is "
    "given back when it ends, and taken over at once if that process is gone",
}


def restart_words(refused: Holder | None) -> str:
    """How the refused run is started again once the output is free: nothing retries it by itself."""
    if refused is None:
        return "Run this step again once the output is free."
    if refused.pid is not None:
        return "This run does not wait for the output: run `datagen run` again once it is free."
    namespace, _, name = refused.run.rpartition("/")
    where = f"-n {namespace} " if namespace else ""
    return (
        "This run is halted and does not retry by itself (its preflight's refusal stands for its spec): once the "
        f"output is free, create it again: `kubectl delete datagenrun {where}{name}`, then apply its manifest again."
    )


class OutputInUse(Exception):
    """The output is leased to another run: who holds it, what it is doing, until when, and what to do."""

    def __init__(self, output: Path, lease: Lease, now: float, refused: Holder | None = None) -> None:
        self.lease = lease
        until = datetime.fromtimestamp(lease.expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doing = _DOING.get(lease.step or "") or (
            f"renewed every {LEASE_RENEW_S:.0f} s while its workers run, and given back when the run's shards are "
            "all done"
        )
        super().__init__(
            f"{output} is held by {lease.run} (lease holder {lease.holder}) until {until}, "
            f"{max(0, round(lease.expires_at - now))} s from now (renewed {max(0, round(now - lease.renewed_at))} s "
            f"ago; {doing}). Two runs on one output would generate every prompt twice: set another "
            f"spec.output.path, or end that run first. {restart_words(refused)}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_lease(output: Path) -> Lease | None:
    try:
        data = orjson.loads(OutputLayout(output).lease.read_bytes())
        known = {f.name for f in fields(Lease)}  # a later version's keys are not this one's to read
        return Lease(**{key: value for key, value in data.items() if key in known})
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, TypeError):
        return None  # a torn or foreign file holds nothing; it is replaced below


def live_lease(output: Path, holder_id: str | None = None, now: float | None = None) -> OutputInUse | None:
    """The refusal a step gets from a live lease that is not `holder_id`'s, without taking it."""
    moment = time.time() if now is None else now
    current = read_lease(output)
    if current is None or current.holder == holder_id or current.stale(moment):
        return None
    return OutputInUse(output, current, moment)


def claim_output(output: Path, holder: Holder | None, duration_s: float, step: str) -> None:
    """A step's claim on the output: a run's step takes (or renews) the lease; a step run by hand, without a
    holder, only respects one. OutputInUse when another run holds it."""
    if holder is not None:
        take_lease(output, holder, duration_s, step=step)
        return
    busy = live_lease(output)
    if busy is not None:
        raise busy


def lease_holder(holder_id: str | None, run: DataGenRun | None) -> Holder | None:
    """The holder a step's `--lease-holder` names, called after its run file's `namespace/name`."""
    if holder_id is None:
        return None
    if run is None:
        return Holder.parse(holder_id, f"run {holder_id}")
    namespace = run.metadata.namespace
    return Holder.parse(holder_id, f"{namespace}/{run.metadata.name}" if namespace else run.metadata.name)


def take_lease(
    output: Path, holder: Holder, duration_s: float, now: float | None = None, *, step: str | None = None
) -> Lease:
    """Take or renew the output's lease for `duration_s` as `step` (STEP_PREFLIGHT, STEP_WORKERS, STEP_LOCAL_RUN:
    what a refusal says the holder is doing); OutputInUse, naming how `holder`'s run starts again, when another
    run holds it."""
    output.mkdir(parents=True, exist_ok=True)
    with _locked(output):
        moment = time.time() if now is None else now
        current = read_lease(output)
        if current is not None and current.holder != holder.id and not current.stale(moment):
            raise OutputInUse(output, current, moment, holder)
        lease = Lease(holder.id, holder.run, holder.host, holder.pid, moment, moment + duration_s, step)
        _write(OutputLayout(output).lease, lease)
        return lease


def release_lease(output: Path, holder: Holder, taken_before: float | None = None) -> Lease | None:
    """Give the lease back (a local run at its end, a step whose refusal halts the run); someone else's lease
    is left alone, and so is one renewed after `taken_before` (a later attempt of the same run took it again).
    Returns the lease given back, None when there was none of `holder`'s to give."""
    if not output.is_dir():
        return None
    with _locked(output):
        current = read_lease(output)
        if current is None or current.holder != holder.id:
            return None
        if taken_before is not None and current.renewed_at > taken_before:
            return None
        with contextlib.suppress(FileNotFoundError):
            OutputLayout(output).lease.unlink()
        return current


@contextlib.contextmanager
def _locked(output: Path) -> Iterator[None]:
    """Read-decide-write of the lease, one taker at a time: `mkdir` is atomic on every filesystem (NFS too).
    A lock left by a process that died inside this short section is broken once older than LOCK_STALE_S."""
    lock = OutputLayout(output).lease_lock
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - lock.stat().st_mtime > LOCK_STALE_S:
                    lock.rmdir()
                    continue
            if time.monotonic() > deadline:
                raise OSError(f"the lease lock {lock} is held for over {LOCK_WAIT_S:.0f} s") from None
            time.sleep(0.01)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.rmdir()


def _write(path: Path, lease: Lease) -> None:
    """Written whole, then renamed into place: a reader sees the old lease or the new, never a torn one."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    staging.write_bytes(orjson.dumps(asdict(lease)))
    os.replace(staging, path)


# --- `datagen release-lease`: a halted run's lease given back by a pod of its own ----------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datagen release-lease",
        description="Give a run's output lease back (what the operator runs once a run halts with the lease "
        "still held: after the parser check, a server that never became ready, a worker's halt).",
    )
    add_shared_arguments(parser, ReleaseLeaseCommand, lease_holder="the run (its UID) whose lease is given back")
    parser.add_argument(
        "--taken-before",
        type=float,
        help="seconds since the epoch: a lease renewed after this is a later attempt's, and is kept",
    )
    return parser


def main(argv: list[str]) -> int:
    """Idempotent: whatever the lease's state, it exits 0 and says in one line what it found."""
    args = build_parser().parse_args(argv)
    output = Path(args.output)
    holder = Holder.parse(args.lease_holder, args.lease_holder)
    try:
        released = release_lease(output, holder, args.taken_before)
    except OSError as error:  # a read-only or failing volume (the halt's own cause, maybe): the lease lapses
        lease = read_lease(output)
        until = f" at {datetime.fromtimestamp(lease.expires_at, UTC):%Y-%m-%dT%H:%M:%SZ}" if lease else ""
        print(f"could not give {output}'s lease back ({error}): it lapses{until}")
        return 0
    current = read_lease(output)
    if released is not None:
        print(f"gave back {output}'s lease, held by {released.run} (lease holder {released.holder})")
    elif current is None:
        print(f"{output} has no lease to give back")
    elif current.holder != holder.id:
        print(f"{output}'s lease is held by {current.run}, not by {holder.id}: left alone")
    else:
        print(f"{output}'s lease was taken again after the halt (renewed at {current.renewed_at:.0f}): kept")
    return 0
