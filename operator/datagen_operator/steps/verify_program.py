"""`datagen verify OUTPUT_DIR` as a program: what OUTPUT holds (no record yet, or not an output at all), the
run's spec, tokenizer and dataset as found on this machine (verify_here, also export's gate), its arguments, and
the report printed as a table, JSON or an HTML page, with the verdict written.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from datagen_operator.api.commands import VerifyCommand
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.paths import on_this_machine
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.step_program import add_shared_arguments, add_trust_remote_code, write_verdict
from datagen_operator.output.layout import OutputLayout
from datagen_operator.steps.verify import VerifyReport, verify_output
from datagen_operator.steps.verify_paths import load_run_spec
from datagen_operator.steps.verify_terminal import render_report


def holds_records(output: Path) -> bool:
    """A manifest, a shard's segment or a compacted Parquet file: something the checks can judge."""
    layout = OutputLayout(output)
    return (
        layout.manifest.exists()
        or any(layout.data_dir.glob("shard-*.parquet"))
        or any(layout.shards_dir.glob("*/segment-*.jsonl"))
    )


def nothing_to_verify(output: Path) -> tuple[str, int] | None:
    """One line saying what OUTPUT is when it holds no record, and the exit code; None when the checks apply.
    A run halted before its workers (a parser mismatch, a failed canary) leaves run.yaml, the dataset pin and
    logs: a table of checks over zero records would only repeat "missing" for each prompt."""
    if holds_records(output):
        return None
    run_file = OutputLayout(output).run_file
    if run_file.exists():
        name = _run_name(run_file)
        # Only files that exist are named: a run halted at the preflight started no server, so it has no logs.
        logs = f"; server logs in {OutputLayout(output).logs}" if OutputLayout(output).logs.is_dir() else ""
        return (
            f"{output}: the output of DataGenRun {name}, with no record in it: the run stopped (or has not yet "
            "started its workers) before any was written, so there is nothing to verify; why it stopped is its "
            f"Succeeded condition (`kubectl describe dgr {name}`, or the `datagen run` log{logs})",
            EXIT_FAILED_VERDICT,
        )
    line = (
        f"{output}: not a datagen output: no manifest.json, run.yaml, shards/ or data/ in it (a run writes them "
        "in its spec.output.path)"
    )
    # `datagen verify out` for `out/quickstart`: name the outputs one level down.
    inside = sorted(
        d.name for d in output.iterdir() if d.is_dir() and (OutputLayout(d).run_file.exists() or holds_records(d))
    )
    if inside:
        line += f"; the outputs in it: {', '.join(inside[:5])}" + (", ..." if len(inside) > 5 else "")
    return line, EXIT_BAD_INPUT


def _run_name(run_file: Path) -> str:
    import yaml

    try:
        document = yaml.safe_load(run_file.read_text()) or {}
        return str(document.get("metadata", {}).get("name") or "?")
    except (OSError, yaml.YAMLError, AttributeError):
        return "?"


@dataclass(frozen=True)
class HostVerification:
    report: VerifyReport
    notes: list[str]
    """Why a check could not use the run's own paths here (a pod's path), and the flag that fills in."""


def verify_here(
    output: Path,
    run_file: Path | None = None,
    *,
    tokenizer_dir: str | None = None,
    dataset: str | None = None,
    trust_remote_code: bool = False,
    fidelity: bool | None = True,
) -> HostVerification:
    """`datagen verify` on this machine (also export's gate). Raises ValueError with the one line to show.
    `fidelity=None`: re-render prompts when the tokenizer and the dataset are both found here. `run_file`: the
    run's manifest (default OUTPUT/run.yaml)."""
    from datagen_operator.api import SpecError

    run_file = run_file or OutputLayout(output).run_file
    try:
        spec = load_run_spec(output, run_file)
    except SpecError as error:
        raise ValueError(f"{run_file}: {error}") from error
    notes: list[str] = []
    dataset_path = Path(dataset) if dataset else None
    if dataset_path is None and spec is not None:
        dataset_path, notes = on_this_machine(spec, output)
    tokenizer = None
    directory = tokenizer_dir or (spec.model.tokenizer_dir if spec else None)
    if directory and Path(directory).is_dir():
        from datagen_operator.prompts.render import load_tokenizer

        trust = trust_remote_code or (resolve_model(spec).trust_remote_code if spec else False)
        try:
            tokenizer = load_tokenizer(directory, trust_remote_code=trust)
        except ValueError as error:  # e.g. remote code without --trust-remote-code: say so, no traceback
            raise ValueError(f"tokenizer {directory}: {error}") from error
    elif directory:
        field = spec.model.tokenizer_field if spec else "spec.model.path"
        notes.append(f"{field} {directory} is not a directory here: pass --tokenizer DIR (the model directory)")
    if fidelity is None:
        fidelity = tokenizer is not None and dataset_path is not None
    report = verify_output(output, spec, tokenizer=tokenizer, dataset=dataset_path, fidelity=fidelity)
    return HostVerification(report, notes)


def verify_as_asked(output: Path, args: argparse.Namespace, *, fidelity: bool | None) -> HostVerification:
    """verify_here with what a step program's shared arguments asked for (--run, --tokenizer, --dataset,
    --trust-remote-code): `datagen verify`, and `datagen export`'s gate."""
    return verify_here(
        output,
        Path(args.run) if args.run else None,
        tokenizer_dir=args.tokenizer,
        dataset=args.dataset,
        trust_remote_code=args.trust_remote_code,
        fidelity=fidelity,
    )


def build_parser() -> argparse.ArgumentParser:
    """`datagen verify`'s arguments; what the shells pass is api/commands.py's VerifyCommand."""
    parser = argparse.ArgumentParser(prog="datagen verify", description="Check an output directory for faithfulness.")
    add_shared_arguments(
        parser,
        VerifyCommand,
        run="the DataGenRun manifest (default: OUTPUT/run.yaml if present)",
        dataset="dataset file (default: the run's dataset path; for a cluster output, that path on the output's "
        "volume, found from OUTPUT)",
    )
    add_trust_remote_code(parser)
    parser.add_argument("--no-fidelity", action="store_true", help="skip re-rendering prompts")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report with plots here")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    output = Path(args.output)
    if not output.is_dir():
        print(f"error: {output}: not a directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    empty = nothing_to_verify(output)
    if empty is not None:
        line, code = empty
        if args.json:
            sys.stdout.write(orjson.dumps({"passed": False, "records": 0, "verdict": line}).decode() + "\n")
        else:
            print(line)
        write_verdict(StepOutcome(False, Reason.NO_RECORDS, line), args.termination_log, echo=False)
        return code
    try:
        verified = verify_as_asked(output, args, fidelity=not args.no_fidelity)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = verified.report
    if args.json:
        sys.stdout.write(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for note in verified.notes:
            print(f"note: {note}")
        render_report(report)
    if args.html:
        from datagen_operator.steps.report_html import write_html_report

        print(f"HTML report: {args.html} ({write_html_report(Path(args.html), report)} bytes)", file=sys.stderr)
    return write_verdict(report.outcome(), args.termination_log, echo=False)
