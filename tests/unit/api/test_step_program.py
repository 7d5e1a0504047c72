"""api.step_program: the step programs' shared arguments, defined once from their contracts, and the one way
each hands its verdict back (stdout, the termination log, the exit code)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from datagen_operator.api.commands import (
    CanaryCommand,
    Command,
    ExportCommand,
    PreflightCommand,
    ReleaseLeaseCommand,
    VerifyCommand,
    flag_of,
)
from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.status import CheckResult
from datagen_operator.api.step_program import SHARED_ARGUMENTS, add_shared_arguments, write_verdict
from datagen_operator.export import run as export
from datagen_operator.output import lease
from datagen_operator.steps import canary, preflight, verify_program

STEP_PARSERS: dict[type[Command], Callable[[], argparse.ArgumentParser]] = {
    PreflightCommand: preflight.build_parser,
    CanaryCommand: canary.build_parser,
    VerifyCommand: verify_program.build_parser,
    ExportCommand: export.build_parser,
    ReleaseLeaseCommand: lease.build_parser,
}


def action_of(parser: argparse.ArgumentParser, field: dataclasses.Field[object]) -> argparse.Action:
    flag = flag_of(field)
    (action,) = [a for a in parser._actions if (flag in a.option_strings if flag else a.dest == field.name)]
    return action


@pytest.mark.parametrize("command", STEP_PARSERS, ids=lambda c: c.PROGRAM)
def test_every_step_program_takes_the_shared_arguments_its_contract_has(command: type[Command]) -> None:
    parser = STEP_PARSERS[command]()
    shared = [f for f in dataclasses.fields(command) if f.name in SHARED_ARGUMENTS]
    assert shared, "every step shares some arguments"
    for field in shared:
        action = action_of(parser, field)
        assert action.help, field.name
        if flag_of(field) is not None:
            assert action.required == (field.default is dataclasses.MISSING), field.name
    # And each one parses: one value for each, at the same name the contract reads it back from.
    argv = [f"{flag}=x" if (flag := flag_of(f)) else "x" for f in shared]
    required = {"--formats": "trl", "--out": "o", "--server": "http://a"}
    argv += [f"{flag}={value}" for flag, value in required.items() if flag in parser._option_string_actions]
    namespace = parser.parse_args(argv)
    assert all(getattr(namespace, action_of(parser, f).dest) == "x" for f in shared)


def test_the_shared_arguments_are_the_ones_the_steps_do_share() -> None:
    steps = [{f.name for f in dataclasses.fields(command)} for command in STEP_PARSERS]
    for name in SHARED_ARGUMENTS:
        assert sum(name in fields for fields in steps) >= 2, name
    with pytest.raises(ValueError, match="not a shared argument: server"):
        add_shared_arguments(argparse.ArgumentParser(), CanaryCommand, server="?")


def test_a_verdict_is_written_to_stdout_and_the_termination_log_and_says_its_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    failed = StepOutcome(False, "Failed", "one check failed", (CheckResult(name="c", passed=False, count=1),))
    assert write_verdict(failed, str(log)) == EXIT_FAILED_VERDICT
    assert StepOutcome.from_storage(log.read_bytes()) == failed
    assert orjson.loads(capsys.readouterr().out) == orjson.loads(log.read_bytes())
    passed = StepOutcome(True, "Passed", "all good")
    assert write_verdict(passed, None, echo=False) == EXIT_OK
    assert capsys.readouterr().out == ""
