"""The datagen programs as the tests start them: each command line built by its api/commands.py type (the same
contract the operator's Jobs and `datagen run` use), run by this interpreter as local/runner.py runs its children."""

from __future__ import annotations

import subprocess
from pathlib import Path

from datagen_operator.api.commands import Command, WorkerCommand
from datagen_operator.local.processes import DATAGEN


def argv(command: Command, *extra: str) -> list[str]:
    """`python -m datagen_operator.cli <program> <its arguments>`, then `extra` (flags no shell passes)."""
    return [*DATAGEN, *command.argv(), *extra]


def run_program(
    command: Command, *extra: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(command, *extra), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_shard_worker(run_file: Path, output: Path, server: str, lease_holder: str | None = None) -> WorkerCommand:
    """The worker of a one-shard run against one server."""
    return WorkerCommand(
        run=str(run_file),
        output=str(output),
        servers=(server,),
        shard_index=0,
        shard_count=1,
        lease_holder=lease_holder,
    )
