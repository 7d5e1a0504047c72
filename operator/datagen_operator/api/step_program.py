"""What the step programs (`datagen preflight|canary|verify|export|release-lease`) share: the arguments their
contracts in api/commands.py have in common, each defined once, and how a verdict is handed back to the shell
that started the step (stdout, the termination log, the exit code)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from datagen_operator.api.commands import Command, flag_of
from datagen_operator.api.exit_codes import verdict_exit
from datagen_operator.api.outcome import StepOutcome

SHARED_ARGUMENTS: dict[str, str] = {
    "run": "the DataGenRun manifest",
    "output": "the run's output directory",
    "tokenizer": "tokenizer dir (default: the run's model.tokenizerPath, else model.path)",
    "dataset": "dataset file (default: the run's spec.dataset.path)",
    "termination_log": "also write the verdict (JSON) here (Kubernetes: the termination message)",
    "lease_holder": "the run (its UID) whose output lease the step takes or gives back (output/lease.py)",
}
"""The fields step commands share, by name, and their help unless a program says what it does with one."""


def add_shared_arguments(parser: argparse.ArgumentParser, command: type[Command], **helps: str) -> None:
    """The shared arguments `command` has, in its order, as its argv() writes them: a positional field is
    positional, a field without a default is required. `helps` gives a program's own words for some."""
    if unknown := set(helps) - set(SHARED_ARGUMENTS):
        raise ValueError(f"not a shared argument: {', '.join(sorted(unknown))}")
    for field in dataclasses.fields(command):
        if field.name not in SHARED_ARGUMENTS:
            continue
        help_ = helps.get(field.name, SHARED_ARGUMENTS[field.name])
        flag = flag_of(field)
        if flag is None:
            parser.add_argument(field.name, help=help_)
        else:
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            parser.add_argument(flag, required=required, help=help_)


def add_trust_remote_code(parser: argparse.ArgumentParser) -> None:
    """For the steps that load a tokenizer without the run's preset having said whether it may run code."""
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="load a tokenizer that ships its own code (Kimi's tiktoken class); default: what the run's preset says",
    )


def write_verdict(outcome: StepOutcome, termination_log: str | None, *, echo: bool = True) -> int:
    """The step's verdict where its shell reads it, and the exit code that says whether it passed: on stdout
    (unless the program prints its own report), and in the termination log (a Job's termination message)."""
    data = outcome.for_storage()
    if echo:
        sys.stdout.write(data.decode() + "\n")
    if termination_log:
        Path(termination_log).write_bytes(data)
    return verdict_exit(outcome.passed)
