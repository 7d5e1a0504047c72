"""`datagen export`'s command line: `--format` (a user's export of OUTPUT to --out, verified first) and `--formats`
(spec.export's Job: every format, its verdict in the termination message), both around `exporter`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.commands import ExportCommand
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.api.export_spec import EXPORT_FORMATS, whole_conversations_asked
from datagen_operator.api.flags import unknown_flags_problem
from datagen_operator.api.step_program import add_shared_arguments, add_trust_remote_code, write_verdict
from datagen_operator.export.conversations import MESSAGES_KEYS, RERENDERED_POLICIES, ROWS
from datagen_operator.export.exporter import (
    DATA_DIR,
    clear_previous_export,
    export_output,
    export_run,
    loss_warnings,
    run_family,
)
from datagen_operator.export.formats import OVER_LENGTH_POLICIES, Selection
from datagen_operator.export.manifest import MANIFEST_NAME, describe_source
from datagen_operator.export.options import (
    DatasetSource,
    ExportOptions,
    TextCodec,
    codec_from_tokenizer,
    options_problem,
)
from datagen_operator.export.writer import DEFAULT_PART_BYTES, PART_GLOB
from datagen_operator.output.layout import OutputLayout
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.draws import variable_draws


def load_run_tokenizer(output: Path, run_file: Path | None, tokenizer_dir: str | None, trust_remote_code: bool) -> Any:
    """The run's tokenizer: --tokenizer, else the run's model.tokenizerPath / model.path (OUTPUT/run.yaml);
    trust_remote_code as the run's preset says (Kimi's tiktoken tokenizer ships its own code)."""
    from datagen_operator.api import anchor_paths, load_run
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.prompts.render import load_tokenizer

    run_file = run_file or OutputLayout(output).run_file
    spec = anchor_paths(load_run(run_file), run_file.resolve().parent).spec if run_file.exists() else None
    directory = tokenizer_dir or (spec.model.tokenizer_dir if spec else None)
    if not directory or not Path(directory).is_dir():
        raise ValueError(f"no tokenizer directory (got {directory!r}): pass --tokenizer DIR")
    trust = trust_remote_code or (resolve_model(spec).trust_remote_code if spec else False)
    return load_tokenizer(directory, trust_remote_code=trust)


def find_dataset(output: Path, run_file: Path | None, dataset: str | None) -> tuple[DatasetSource | None, str]:
    """The run's dataset: --dataset, else spec.dataset.path from OUTPUT/run.yaml (found on the output's volume for a
    cluster run, as `datagen verify` finds it); read with the run's dataset format and id field. None and why not."""
    from datagen_operator.api.paths import on_this_machine
    from datagen_operator.steps.verify_paths import load_run_spec

    spec = load_run_spec(output, run_file)
    draws = variable_draws(spec.generation.template_variable_mix) if spec is not None else None
    if dataset:
        path = Path(dataset)
        if not path.is_file():
            return None, f"--dataset {dataset}: not a file"
        return DatasetSource(DatasetRef.of(spec.dataset if spec is not None else None, path), draws), ""
    if spec is None:
        return None, f"no {run_file or OutputLayout(output).run_file} to find the dataset from: pass --dataset FILE"
    found, notes = on_this_machine(spec, output)
    if found is None:
        return None, "; ".join(notes) or "the run's dataset is not found here: pass --dataset FILE"
    return DatasetSource(DatasetRef.of(spec.dataset, found), draws), ""


def build_parser() -> argparse.ArgumentParser:
    """`datagen export`'s arguments; what the operator passes is api/commands.py's ExportCommand."""
    parser = argparse.ArgumentParser(
        prog="datagen export",
        description="Write a run's exact token records in a trainer's format (docs/export.md).",
    )
    add_shared_arguments(
        parser,
        ExportCommand,
        run="the DataGenRun manifest (default: OUTPUT/run.yaml)",
        tokenizer="tokenizer dir for --format text (default: the run's model path)",
        termination_log="with --formats: write the verdict (JSON) here too",
        dataset="the run's dataset (default: the run's spec.dataset.path, found as `datagen verify` finds it): the "
        "planned turns of whole conversations, the user turns of --format conversations",
    )
    add_trust_remote_code(parser)
    parser.add_argument("--format", choices=EXPORT_FORMATS, dest="export_format")
    parser.add_argument(
        "--formats", help="comma-separated formats, each to OUT/<format>, replacing an earlier one (spec.export)"
    )
    parser.add_argument("--out", required=True, help="directory for the parts, export-manifest.json and token_freq.*")
    parser.add_argument(
        "--max-length", type=int, help="rows longer than this (prompt + completion) follow --over-length"
    )
    parser.add_argument(
        "--over-length",
        choices=OVER_LENGTH_POLICIES,
        default="drop",
        help="drop over-long rows, or keep them whole with metadata.over_length (never cut: the stop token is last)",
    )
    parser.add_argument(
        "--exclude-flags", default="", help="comma-separated record flags to leave out, e.g. truncated,aborted"
    )
    parser.add_argument(
        "--last-turn-only",
        action="store_true",
        help="text format: prompt/completion columns so only the generated turn is supervised (token formats always are)",
    )
    parser.add_argument(
        "--part-bytes", type=int, default=DEFAULT_PART_BYTES, help="start a new part file beyond this size"
    )
    parser.add_argument(
        "--rows",
        choices=ROWS,
        default="turns",
        help="token formats of a generation.turns: all output: one row per recorded turn, or one per whole "
        "conversation (its last turn's tokens, the loss over every answer it holds verbatim)",
    )
    parser.add_argument(
        "--rerendered-spans",
        choices=RERENDERED_POLICIES,
        default="unmasked",
        help="--rows conversations: an earlier answer the template re-rendered stays as context with mask 0 "
        "(counted), or its conversation is left out (drop-row, counted)",
    )
    parser.add_argument(
        "--messages-key",
        choices=MESSAGES_KEYS,
        default="conversations",
        help="--format conversations: the list's key (conversations: SpecForge; messages: TRL, OpenAI)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="with --format: export an output that fails `datagen verify` (or cannot be verified here); by "
        "default such an output is refused",
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.export_format is None) == (args.formats is None):
        parser.error("give one of --format or --formats")
    return args


def excluded_flags(text: str) -> tuple[frozenset[str], str | None]:
    """--exclude-flags (comma-separated) as flag names, and why not when one is no record flag (both commands)."""
    names = frozenset(flag.strip() for flag in text.split(",") if flag.strip())
    problem = unknown_flags_problem(names)
    return names, f"--exclude-flags: {problem}" if problem is not None else None


def main_formats(args: argparse.Namespace) -> int:
    """--formats: the export Job of a run with spec.export; its verdict in the termination message."""
    from datagen_operator.api.outcome import StepOutcome
    from datagen_operator.api.reasons import Reason

    formats = [name.strip() for name in args.formats.split(",") if name.strip()]
    exclude, flags_problem = excluded_flags(args.exclude_flags)
    output = Path(args.output)
    if not formats or set(formats) - set(EXPORT_FORMATS):
        outcome = StepOutcome(
            False, Reason.EXPORT_FAILED, f"--formats {args.formats!r}: each one of {', '.join(EXPORT_FORMATS)}"
        )
    elif flags_problem is not None:
        outcome = StepOutcome(False, Reason.EXPORT_FAILED, flags_problem)
    elif not output.is_dir():
        outcome = StepOutcome(False, Reason.EXPORT_FAILED, f"{output}: not a directory")
    else:

        def codec() -> TextCodec:
            run_file = Path(args.run) if args.run else None
            return codec_from_tokenizer(load_run_tokenizer(output, run_file, args.tokenizer, args.trust_remote_code))

        selection = Selection(exclude, args.max_length, args.over_length)
        dataset, why = (None, "")
        if whole_conversations_asked(args.rows, formats) or args.dataset:
            dataset, why = find_dataset(output, Path(args.run) if args.run else None, args.dataset)
        if dataset is None and (args.dataset or "conversations" in formats):
            outcome = StepOutcome(False, Reason.EXPORT_FAILED, f"conversations: {why}")
        else:
            outcome = export_run(
                output, Path(args.out), formats, selection, codec,
                rows=args.rows, rerendered_spans=args.rerendered_spans, dataset=dataset,
            )  # fmt: skip
    return write_verdict(outcome, args.termination_log)


def unverified_refusal(output: Path, args: argparse.Namespace) -> tuple[str, int] | None:
    """Why OUTPUT is not exported, in one line, and the exit code; None to go ahead. An output with no record
    (a halted run's, or not a run's at all) has nothing to export. Otherwise the output is verified first, as
    `datagen verify` would here (prompts re-rendered where the tokenizer and dataset are found): training on
    data that failed a check is what this project exists to prevent, so that takes --allow-unverified."""
    from datagen_operator.steps.verify_program import nothing_to_verify, verify_as_asked

    empty = nothing_to_verify(output)
    if empty is not None:
        return f"nothing to export: {empty[0]}", EXIT_BAD_INPUT
    if args.allow_unverified:
        return None
    try:
        verified = verify_as_asked(output, args, fidelity=None)
    except ValueError as error:
        return f"{output} cannot be verified here ({error}); --allow-unverified exports it anyway", EXIT_FAILED_VERDICT
    failed = [check for check in verified.report.checks if not check.passed]
    if not failed:
        return None
    named = ", ".join(f"{check.name} ({check.verdict})" for check in failed)
    return (
        f"{output} fails verification: {named}; `datagen verify {output}` shows the report, "
        "--allow-unverified exports it anyway (rows keep their record flags)",
        EXIT_FAILED_VERDICT,
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.formats is not None:
        return main_formats(args)
    output, out_dir = Path(args.output), Path(args.out)
    options, codec, problems = _format_options(args, output, out_dir)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    refusal = unverified_refusal(output, args)
    if refusal is not None:
        line, code = refusal
        print(f"error: {line}", file=sys.stderr)
        return code
    if args.overwrite and out_dir.is_dir():
        clear_previous_export(out_dir)
    manifest = export_output(output, out_dir, options, codec)
    for warning in loss_warnings(manifest, run_family(output)):
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(orjson.dumps(_summary(manifest, args.export_format, out_dir)).decode() + "\n")
    return EXIT_OK


def _format_options(
    args: argparse.Namespace, output: Path, out_dir: Path
) -> tuple[ExportOptions, TextCodec | None, list[str]]:
    """--format's options, the tokenizer's codec where the format uses it, and every problem with the arguments."""
    exclude, flags_problem = excluded_flags(args.exclude_flags)
    problems = []
    if not output.is_dir():
        problems.append(f"{output}: not a directory")
    if flags_problem is not None:
        problems.append(flags_problem)
    if args.max_length is not None and args.max_length < 1:
        problems.append("--max-length must be positive")
    if out_dir.resolve() == output.resolve():
        problems.append("--out must not be the run's output directory")
    if ((out_dir / MANIFEST_NAME).exists() or any((out_dir / DATA_DIR).glob(PART_GLOB))) and not args.overwrite:
        problems.append(f"{out_dir} holds an export already: pass --overwrite to replace it")
    run_file = Path(args.run) if args.run else None
    codec = None
    if not problems and args.export_format in ("conversations", "text"):
        try:
            codec = codec_from_tokenizer(load_run_tokenizer(output, run_file, args.tokenizer, args.trust_remote_code))
        except (ValueError, OSError) as error:
            if args.export_format == "text":
                problems.append(f"tokenizer: {error}")
            else:  # it measures what a template-based trainer keeps of the conversations; without it, not measured
                print(
                    f"warning: not measuring what a trainer rendering the conversations keeps: {error}", file=sys.stderr
                )
    dataset = None
    if not problems and (whole_conversations_asked(args.rows, (args.export_format,)) or args.dataset):
        dataset, why = find_dataset(output, run_file, args.dataset)
        if dataset is None and (args.dataset or args.export_format == "conversations"):
            problems.append(f"dataset: {why}")
    options = ExportOptions(
        export_format=args.export_format,
        selection=Selection(exclude, args.max_length, args.over_length),
        last_turn_only=args.last_turn_only,
        part_bytes=args.part_bytes,
        rows=args.rows,
        rerendered_spans=args.rerendered_spans,
        dataset=dataset,
        messages_key=args.messages_key,
    )
    if not problems and output.is_dir():
        problem = options_problem(options, describe_source(output)["turns"])
        if problem is not None:
            problems.append(problem)
    return options, codec, problems


def _summary(manifest: dict[str, Any], export_format: str, out_dir: Path) -> dict[str, Any]:
    """The line `datagen export` prints: where, what, how much, and what was left out or not supervised."""
    supervision = manifest["supervision"]
    summary = {
        "out": str(out_dir),
        "format": export_format,
        "family": manifest["source"]["preset"],
        "supervision": supervision["line"],  # supervised / generated tokens, the ratio, and why below 1
        "supervised_ratio": supervision["ratio"],
        **manifest["counts"],
        "left_out_by": manifest["left_out"],
        "unsupervised_tokens_by": supervision["unsupervised_tokens"],
    }
    if not manifest["source"]["complete"]:
        summary["note"] = "the run is not complete: rows from uncompacted shards carry metadata.unfinished"
    return summary
