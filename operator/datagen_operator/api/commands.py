"""The command lines of the programs the shells start: `datagen preflight|canary|worker|verify|export|
release-lease`.

One frozen dataclass per program with the arguments the shells pass: the operator (k8s/job_manifests.py, a Job's
container command) and `datagen run` (local/runner.py, a worker child process) build a program's argv only
through these. Each field is one argument of the program's own parser (`build_parser()` in
steps/preflight.py, steps/canary.py, worker/config.py, steps/verify_program.py, export/run.py, output/lease.py), spelled
`--field-name` unless its metadata says otherwise; tests/unit/api/test_commands.py parses every command back with
that parser and gets the same values, and holds each field's default to the parser's.

argv() writes the fields in their order (a Job's command is part of its pod template, whose hash decides
whether the Job is replaced) and leaves out a field at its default; it starts with the subcommand, and each
shell puts its way of running `datagen` before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

POSITIONAL: Mapping[str, Any] = {"positional": True}
"""A field written as a bare argument, not after a --flag."""
JOINED: Mapping[str, Any] = {"joined": ","}
"""A tuple written as one comma-separated argument (the program splits it)."""
SERVERS: Mapping[str, Any] = {"flag": "--server"}
"""The server URLs: one --server per URL."""


def flag_of(spec: dataclasses.Field[Any]) -> str | None:
    """A field's --flag; None for a positional field."""
    if spec.metadata.get("positional"):
        return None
    return str(spec.metadata.get("flag") or "--" + spec.name.replace("_", "-"))


def _words(spec: dataclasses.Field[Any], value: Any) -> list[str]:
    flag = flag_of(spec)
    if flag is None:
        return [str(value)]
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, tuple):
        joiner = spec.metadata.get("joined")
        if joiner is not None:
            return [flag, joiner.join(value)]
        return [word for item in value for word in (flag, str(item))]
    return [flag, str(value)]


@dataclass(frozen=True, kw_only=True)
class Command:
    """A datagen program's command line."""

    PROGRAM: ClassVar[str]

    def argv(self) -> list[str]:
        """The subcommand and its arguments, in the fields' order; a field at its default is left out."""
        words = [self.PROGRAM]
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if spec.default is not dataclasses.MISSING and value == spec.default:
                continue
            words += _words(spec, value)
        return words


@dataclass(frozen=True, kw_only=True)
class PreflightCommand(Command):
    """`datagen preflight`: the dataset, tokenizer and output checked before a server starts."""

    PROGRAM: ClassVar[str] = "preflight"
    run: str
    tokenizer: str | None = None
    dataset: str | None = None
    output: str | None = None
    termination_log: str | None = None
    lease_holder: str | None = None
    """The run (its UID) that takes the output's lease (output/lease.py)."""


@dataclass(frozen=True, kw_only=True)
class CanaryCommand(Command):
    """`datagen canary`: a few real prompts through the running servers, judged before bulk generation."""

    PROGRAM: ClassVar[str] = "canary"
    run: str
    tokenizer: str | None = None
    dataset: str | None = None
    servers: tuple[str, ...] = field(metadata=SERVERS)
    records: str | None = None
    termination_log: str | None = None
    output: str | None = None
    lease_holder: str | None = None
    """The run (its UID) whose output lease the canary gives back when its refusal halts the run."""


@dataclass(frozen=True, kw_only=True)
class WorkerCommand(Command):
    """`datagen worker`: one shard through the servers into the output (worker/config.py reads the rest of
    its arguments, which no shell passes, at their defaults)."""

    PROGRAM: ClassVar[str] = "worker"
    run: str
    output: str
    dataset: str | None = None
    tokenizer: str | None = None
    shard_index: int | None = None
    """Default: $JOB_COMPLETION_INDEX (an Indexed Job's pod)."""
    shard_count: int | None = None
    """Default: spec.clients.shards."""
    servers: tuple[str, ...] = field(metadata=SERVERS)
    progress_configmap: str | None = None
    log_format: str = "auto"
    termination_log: str | None = None
    lease_holder: str | None = None
    """The run (its UID) that holds the output's lease (output/lease.py)."""
    no_steal: bool = False
    """Do not take other shards' chunks (worker/stealing.py); stealing is on by default."""
    concurrency: int | None = None
    """clients.concurrency auto: the requests in flight per shard its canary resolved (ignored when the spec
    sets a number, so a live change to one applies to the next pods)."""


@dataclass(frozen=True, kw_only=True)
class VerifyCommand(Command):
    """`datagen verify`: the whole output checked, read-only."""

    PROGRAM: ClassVar[str] = "verify"
    output: str = field(metadata=POSITIONAL)
    run: str | None = None
    tokenizer: str | None = None
    dataset: str | None = None
    json: bool = False
    termination_log: str | None = None


@dataclass(frozen=True, kw_only=True)
class ExportCommand(Command):
    """`datagen export --formats`: the verified output in trainer formats, each to OUT/<format>."""

    PROGRAM: ClassVar[str] = "export"
    output: str = field(metadata=POSITIONAL)
    formats: tuple[str, ...] = field(metadata=JOINED)
    out: str
    run: str | None = None
    tokenizer: str | None = None
    termination_log: str | None = None
    max_length: int | None = None
    exclude_flags: tuple[str, ...] = field(default=(), metadata=JOINED)
    rows: str = "turns"
    rerendered_spans: str = "unmasked"
    dataset: str | None = None


@dataclass(frozen=True, kw_only=True)
class ReleaseLeaseCommand(Command):
    """`datagen release-lease`: a halted run's output lease given back (output/lease.py)."""

    PROGRAM: ClassVar[str] = "release-lease"
    output: str = field(metadata=POSITIONAL)
    lease_holder: str
    taken_before: float | None = None
    """Seconds since the epoch: a lease renewed after it (a later attempt of the run) is kept."""


STEP_COMMANDS: tuple[type[Command], ...] = (
    PreflightCommand,
    CanaryCommand,
    VerifyCommand,
    ExportCommand,
    ReleaseLeaseCommand,
)
"""The one-shot steps, each a Job with one failure policy (k8s/job_manifests.py): its exit says whether it wrote a
verdict that did not pass, or crashed (api/exit_codes.py). release-lease writes none: it only ever crashes."""
