"""api.commands: the one contract of the command lines the shells start, held to the programs' own parsers."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.api import parse_run, parse_spec
from datagen_operator.api.commands import (
    CanaryCommand,
    Command,
    ExportCommand,
    PreflightCommand,
    ReleaseLeaseCommand,
    VerifyCommand,
    WorkerCommand,
    flag_of,
)
from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.cli import COMMANDS
from datagen_operator.export import run as export
from datagen_operator.k8s import job_manifests, object_meta
from datagen_operator.output import lease
from datagen_operator.steps import canary, preflight, verify_program
from datagen_operator.worker import config as worker
from tests.manifests import local_run, unit_spec

PARSERS: dict[type[Command], Callable[[], argparse.ArgumentParser]] = {
    PreflightCommand: preflight.build_parser,
    CanaryCommand: canary.build_parser,
    WorkerCommand: worker.build_parser,
    VerifyCommand: verify_program.build_parser,
    ExportCommand: export.build_parser,
    ReleaseLeaseCommand: lease.build_parser,
}

EVERY_FIELD: list[Command] = [
    PreflightCommand(run="r.yaml", tokenizer="tok", dataset="d.jsonl", output="out", termination_log="log",
                     lease_holder="uid"),
    CanaryCommand(run="r.yaml", tokenizer="tok", dataset="d.jsonl", servers=("http://a", "http://b"),
                  records="out/canary.jsonl", termination_log="log", output="out", lease_holder="uid"),
    WorkerCommand(run="r.yaml", output="out", dataset="d.jsonl", tokenizer="tok", shard_index=2, shard_count=3,
                  servers=("http://a", "http://b"), progress_configmap="cm-{index}", log_format="json",
                  termination_log="log", lease_holder="uid", no_steal=True,
                  concurrency=71),
    VerifyCommand(output="out", run="r.yaml", tokenizer="tok", dataset="d.jsonl", json=True, termination_log="log"),
    ExportCommand(output="out", formats=("speculators", "trl"), out="out/x", run="r.yaml", tokenizer="tok",
                  termination_log="log", max_length=4096, exclude_flags=("truncated", "aborted"), rows="conversations",
                  rerendered_spans="drop-row", dataset="data.jsonl"),
    ReleaseLeaseCommand(output="out", lease_holder="uid", taken_before=1764780000.0),
]  # fmt: skip
"""Each command with every field away from its default, so each one is written and read back."""

ONLY_REQUIRED: list[Command] = [
    PreflightCommand(run="r.yaml"),
    CanaryCommand(run="r.yaml", servers=("http://a",)),
    WorkerCommand(run="r.yaml", output="out", servers=("http://a",)),
    VerifyCommand(output="out"),
    ExportCommand(output="out", formats=("trl",), out="x"),
    ReleaseLeaseCommand(output="out", lease_holder="uid"),
]
"""Each command at its defaults: read back, the program's defaults are the contract's."""


def parsed(kind: type[Command], argv: list[str]) -> Command:
    """`argv` (after the subcommand) through the program's own parser, as the contract's command."""
    namespace = PARSERS[kind]().parse_args(argv)
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(kind):
        flag = flag_of(spec)
        value = getattr(namespace, spec.name if flag is None else flag.lstrip("-").replace("-", "_"))
        if (joiner := spec.metadata.get("joined")) is not None:
            value = tuple(part for part in value.split(joiner) if part) if value else ()
        elif isinstance(value, list):
            value = tuple(value)
        values[spec.name] = value
    return kind(**values)


def test_every_field_of_the_full_commands_is_away_from_its_default() -> None:
    assert {type(c) for c in EVERY_FIELD} == {type(c) for c in ONLY_REQUIRED} == set(PARSERS)
    for command in EVERY_FIELD:
        for spec in dataclasses.fields(command):
            assert getattr(command, spec.name) != spec.default, f"{type(command).__name__}.{spec.name}"


@pytest.mark.parametrize("command", EVERY_FIELD + ONLY_REQUIRED, ids=lambda c: f"{c.PROGRAM}-{len(c.argv())}")
def test_each_command_reads_back_the_same_through_its_programs_own_parser(command: Command) -> None:
    argv = command.argv()
    assert argv[0] == command.PROGRAM and command.PROGRAM in COMMANDS  # a `datagen` subcommand
    assert parsed(type(command), argv[1:]) == command


RUN = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")
SPEC = parse_spec(unit_spec(**{"model.tokenizerPath": "/models/kimi/tok"}))
EXPORTING = SPEC.model_copy(
    update={"export": ExportSpec.model_validate({"formats": ["speculators", "trl"], "maxLength": 4096,
                                                  "excludeFlags": ["truncated"]})}
)  # fmt: skip
URLS = ["http://a", "http://b"]


def job_command(job: object_meta.Manifest) -> list[str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


OPERATOR_COMMANDS = {
    "preflight": (
        job_command(job_manifests.preflight_job(RUN, SPEC, "img:1", 1)),
        ["datagen", "preflight", "--run", "/etc/datagen/run.yaml", "--tokenizer", "/models/kimi/tok",
         "--dataset", "/mnt/datagen/dataset/prompts/b1.jsonl", "--output", "/mnt/datagen/output/eagle3/b1",
         "--termination-log", "/dev/termination-log", "--lease-holder", "u-1"],
    ),
    "canary": (
        job_command(job_manifests.canary_job(RUN, SPEC, "img:1", URLS, 1)),
        ["datagen", "canary", "--run", "/etc/datagen/run.yaml", "--tokenizer", "/models/kimi/tok",
         "--dataset", "/mnt/datagen/dataset/prompts/b1.jsonl", "--server", "http://a", "--server", "http://b",
         "--records", "/mnt/datagen/output/eagle3/b1/canary.jsonl", "--termination-log", "/dev/termination-log",
         "--output", "/mnt/datagen/output/eagle3/b1", "--lease-holder", "u-1"],
    ),
    "worker": (
        job_command(job_manifests.workers_job(RUN, SPEC, "img:1", URLS, suspend=False)),
        ["datagen", "worker", "--run", "/etc/datagen/run.yaml", "--output", "/mnt/datagen/output/eagle3/b1",
         "--dataset", "/mnt/datagen/dataset/prompts/b1.jsonl", "--tokenizer", "/models/kimi/tok",
         "--server", "http://a", "--server", "http://b", "--progress-configmap", "kimi-shard-$(JOB_COMPLETION_INDEX)",
         "--log-format", "json", "--termination-log", "/dev/termination-log", "--lease-holder", "u-1"],
    ),
    "verify": (
        job_command(job_manifests.verify_job(RUN, SPEC, "img:1")),
        ["datagen", "verify", "/mnt/datagen/output/eagle3/b1", "--run", "/etc/datagen/run.yaml",
         "--tokenizer", "/models/kimi/tok", "--dataset", "/mnt/datagen/dataset/prompts/b1.jsonl", "--json",
         "--termination-log", "/dev/termination-log"],
    ),
    "export": (
        job_command(job_manifests.export_job(RUN, EXPORTING, "img:1")),
        ["datagen", "export", "/mnt/datagen/output/eagle3/b1", "--formats", "speculators,trl",
         "--out", "/mnt/datagen/output/eagle3/b1/export", "--run", "/etc/datagen/run.yaml",
         "--tokenizer", "/models/kimi/tok", "--termination-log", "/dev/termination-log", "--max-length", "4096",
         "--exclude-flags", "truncated"],
    ),
}  # fmt: skip
"""The operator's Jobs' commands, word for word as before the contract: a Job's command is in its pod template,
whose hash decides whether the Job is replaced."""


@pytest.mark.parametrize("program", OPERATOR_COMMANDS)
def test_the_operators_jobs_run_the_contracts_commands_unchanged(program: str) -> None:
    command, before = OPERATOR_COMMANDS[program]
    assert command == before
    kind = {kind.PROGRAM: kind for kind in PARSERS}[program]
    assert ["datagen", *parsed(kind, command[2:]).argv()] == command


def test_the_local_runner_starts_the_contracts_worker(tmp_path: Path) -> None:
    from datagen_operator.local.runner import LocalRunner

    run = parse_run(local_run(tmp_path / "model", tmp_path / "d.jsonl", tmp_path / "out", **{"clients.shards": 3}))
    runner = LocalRunner(run, tmp_path / "out", simulator=True)
    argv = runner.worker_argv(1, URLS)
    assert argv[:4] == [sys.executable, "-m", "datagen_operator.cli", "worker"]
    expected = WorkerCommand(
        run=str(tmp_path / "out" / "run.yaml"),
        output=str(tmp_path / "out"),
        shard_index=1,
        shard_count=3,
        servers=tuple(URLS),
        lease_holder=runner.holder.id,
    )
    assert parsed(WorkerCommand, argv[4:]) == expected and argv[3:] == expected.argv()
    # the words it started before the contract, --lease-holder now after the servers (the operator's order)
    assert argv[4:] == [
        "--run", str(tmp_path / "out" / "run.yaml"), "--output", str(tmp_path / "out"),
        "--shard-index", "1", "--shard-count", "3", "--server", "http://a", "--server", "http://b",
        "--lease-holder", runner.holder.id,
    ]  # fmt: skip
