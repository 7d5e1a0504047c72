"""`datagen export OUTPUT --format speculators|trl|text --out DIR`: the I/O shell around `formats`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.export import FORMATS
from datagen_operator.export.formats import (
    OVER_LENGTH_POLICIES,
    Selection,
    completion_counts,
    effective_flags,
    exclusion_reason,
    finish_type,
    is_over_length,
    list_lengths,
    row_metadata,
    speculators_row,
    text_row,
    token_columns,
    trl_schema,
    trl_table,
)
from datagen_operator.export.manifest import (
    MANIFEST_NAME,
    ExportTally,
    build_manifest,
    describe_source,
    write_manifest,
)
from datagen_operator.export.reader import BATCH_TOKENS, iter_source_batches, prefetched
from datagen_operator.export.vocab_freq import JSON_NAME, NPY_NAME, TokenFrequency
from datagen_operator.export.writer import DEFAULT_PART_BYTES, PART_GLOB, JsonlParts, ParquetParts

if TYPE_CHECKING:
    from datagen_operator.api.outcome import StepOutcome

DATA_DIR = "data"
"""Parts go in OUT/data/, alone: consumers that load every *.json/*.jsonl of a directory (speculators'
prepare-data) must not pick up the manifest or token_freq.json beside them."""


@dataclass(frozen=True)
class ExportOptions:
    export_format: str
    selection: Selection = field(default_factory=Selection)
    last_turn_only: bool = False
    part_bytes: int = DEFAULT_PART_BYTES
    batch_tokens: int = BATCH_TOKENS

    def to_json(self) -> dict[str, Any]:
        selection = asdict(self.selection)
        selection["exclude_flags"] = sorted(self.selection.exclude_flags)
        return {
            **selection,
            "last_turn_only": self.last_turn_only,
            # Token formats always supervise the completion only: that IS the last assistant turn.
            "last_turn_only_applies": self.export_format == "text",
            "part_bytes": self.part_bytes,
        }


@dataclass(frozen=True)
class TextCodec:
    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]
    vocab_size: int | None


def codec_from_tokenizer(tokenizer: Any) -> TextCodec:
    from datagen_operator.prompts.render import backend_encoder

    # No special tokens added: the decoded text already holds the template's own (BOS included, if any).
    encode = backend_encoder(tokenizer) or (lambda text: tokenizer.encode(text, add_special_tokens=False))

    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text

    return TextCodec(decode, encode, len(tokenizer))


def export_output(
    output_dir: str | Path, out_dir: str | Path, options: ExportOptions, codec: TextCodec | None = None
) -> dict[str, Any]:
    """Export every record of the run once (minus what the selection leaves out); returns the manifest."""
    output_dir, out_dir = Path(output_dir), Path(out_dir)
    if options.export_format not in FORMATS:
        raise ValueError(f"unknown format {options.export_format!r}; one of {', '.join(FORMATS)}")
    if options.export_format == "text" and codec is None:
        raise ValueError("the text format needs the run's tokenizer")
    data_dir = out_dir / DATA_DIR
    data_dir.mkdir(parents=True, exist_ok=True)
    source = describe_source(output_dir)
    tally, frequency = ExportTally(), TokenFrequency()
    selection = options.selection
    parts: JsonlParts | ParquetParts = (
        ParquetParts(data_dir, trl_schema(), options.part_bytes)
        if options.export_format == "trl"
        else JsonlParts(data_dir, options.part_bytes)
    )
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens)):
        records = batch.records
        tally.records_read += records.num_rows
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        finishes = [finish_type(value) for value in records.column("finish_reason").to_pylist()]
        flags = records.column("flags").to_pylist()
        lengths = (list_lengths(records.column("input_ids")) + list_lengths(records.column("output_ids"))).tolist()
        keep: list[int] = []
        for row, (prompt_id, sample) in enumerate(zip(prompt_ids, samples, strict=True)):
            reason = exclusion_reason(effective_flags(flags[row] or (), finishes[row]), lengths[row], selection)
            if reason is None:
                keep.append(row)
            else:
                tally.leave_out(reason, prompt_id, sample)
        if not keep:
            continue
        kept = records if len(keep) == records.num_rows else records.take(pa.array(keep, type=pa.int64()))
        tokens = token_columns(kept.column("input_ids"), kept.column("output_ids"))
        prompt_tokens, completion_tokens = (
            kept.column("prompt_tokens").to_pylist(),
            kept.column("completion_tokens").to_pylist(),
        )
        metadata = [
            row_metadata(
                finishes[row],
                prompt_tokens[i],
                completion_tokens[i],
                flags[row] or [],
                unfinished=batch.unfinished,
                over_length=is_over_length(lengths[row], selection),
            )
            for i, row in enumerate(keep)
        ]
        prompt_total, completion_total = int(tokens.prompt_lengths.sum()), int(tokens.completion_lengths.sum())
        frequency.add(completion_counts(tokens))
        tally.rows_written += len(keep)
        tally.tokens_written += prompt_total + completion_total
        tally.prompt_tokens += prompt_total
        tally.completion_tokens += completion_total
        tally.rows_unfinished += len(keep) if batch.unfinished else 0
        tally.rows_over_length_kept += sum(m["over_length"] for m in metadata)
        if options.export_format == "trl":
            assert isinstance(parts, ParquetParts)
            parts.write_table(
                trl_table(kept.column("id"), kept.column("sample"), tokens, metadata), prompt_total + completion_total
            )
            continue
        assert isinstance(parts, JsonlParts)
        lines = []
        for i, row in enumerate(keep):
            prompt, completion = tokens.prompt(i), tokens.completion(i)
            if options.export_format == "speculators":
                lines.append(speculators_row(prompt_ids[row], samples[row], prompt, completion, metadata[i]))
            else:
                assert codec is not None
                line = text_row(
                    prompt_ids[row], samples[row], prompt, completion, metadata[i],
                    decode=codec.decode, encode=codec.encode, last_turn_only=options.last_turn_only,
                )  # fmt: skip
                tally.roundtrip_failed += b'"roundtrip_ok":false' in line
                lines.append(line)
        parts.write_lines(lines, prompt_total + completion_total)
    written = parts.close()
    token_freq = frequency.write(out_dir, codec.vocab_size if codec else None)
    manifest = build_manifest(
        export_format=options.export_format,
        source=source,
        options=options.to_json(),
        tally=tally,
        parts=[{**part.to_json(), "name": f"{DATA_DIR}/{part.name}"} for part in written],
        token_freq=token_freq,
    )
    write_manifest(out_dir, manifest)
    return manifest


# --- spec.export: every asked format after a run's final verification ---------------------------------


def export_run(
    output_dir: str | Path,
    root: str | Path,
    formats: Sequence[str],
    selection: Selection,
    codec: Callable[[], TextCodec],
) -> StepOutcome:
    """Each format to ROOT/<format>, replacing an earlier export there; the verdict for the Exported condition.

    `codec` is called only when the text format is asked for (it loads the run's tokenizer)."""
    from datagen_operator.api.outcome import StepOutcome
    from datagen_operator.api.reasons import Reason

    words = []
    try:
        for export_format in formats:
            out_dir = Path(root) / export_format
            if out_dir.is_dir():
                clear_previous_export(out_dir)
            options = ExportOptions(export_format=export_format, selection=selection)
            manifest = export_output(output_dir, out_dir, options, codec() if export_format == "text" else None)
            counts = manifest["counts"]
            left_out = sum(manifest["left_out"].values())
            words.append(f"{export_format}: {counts['rows_written']} rows, {counts['tokens_written']} tokens")
            words[-1] += f", {left_out} left out" if left_out else ""
    except (OSError, ValueError) as error:
        done = f" ({'; '.join(words)})" if words else ""
        return StepOutcome(False, Reason.EXPORT_FAILED, f"{export_format}: {error}{done}")
    return StepOutcome(True, Reason.EXPORTED, f"{'; '.join(words)} in {root}")


# --- command line -----------------------------------------------------------------------------------


def clear_previous_export(out_dir: Path) -> None:
    """Only what an export writes: a user's other files in DIR are never touched."""
    data_dir = out_dir / DATA_DIR
    for path in [*data_dir.glob(PART_GLOB), *data_dir.glob(f".{PART_GLOB}.tmp")]:
        path.unlink()
    for name in (MANIFEST_NAME, NPY_NAME, JSON_NAME):
        (out_dir / name).unlink(missing_ok=True)


def load_run_tokenizer(output: Path, run_file: Path | None, tokenizer_dir: str | None, trust_remote_code: bool) -> Any:
    """The run's tokenizer: --tokenizer, else the run's model.tokenizerPath / model.path (OUTPUT/run.yaml);
    trust_remote_code as the run's preset says (Kimi's tiktoken tokenizer ships its own code)."""
    from datagen_operator.api import anchor_paths, load_run
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.prompts.render import load_tokenizer

    run_file = run_file or output / "run.yaml"
    spec = anchor_paths(load_run(run_file), run_file.resolve().parent).spec if run_file.exists() else None
    directory = tokenizer_dir or (spec.model.tokenizer_dir if spec else None)
    if not directory or not Path(directory).is_dir():
        raise ValueError(f"no tokenizer directory (got {directory!r}): pass --tokenizer DIR")
    trust = trust_remote_code or (resolve_model(spec).trust_remote_code if spec else False)
    return load_tokenizer(directory, trust_remote_code=trust)


def build_parser() -> argparse.ArgumentParser:
    """`datagen export`'s arguments; what the operator passes is api/commands.py's ExportCommand."""
    parser = argparse.ArgumentParser(
        prog="datagen export",
        description="Write a run's exact token records in a trainer's format (docs/export.md).",
    )
    parser.add_argument("output", help="the run's output directory")
    parser.add_argument("--format", choices=FORMATS, dest="export_format")
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
    parser.add_argument("--tokenizer", help="tokenizer dir for --format text (default: the run's model path)")
    parser.add_argument("--trust-remote-code", action="store_true", help="default: what the run's preset says")
    parser.add_argument("--run", help="the DataGenRun manifest (default: OUTPUT/run.yaml)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="with --format: export an output that fails `datagen verify` (or cannot be verified here); by "
        "default such an output is refused",
    )
    parser.add_argument("--termination-log", help="with --formats: write the verdict (JSON) here too")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.export_format is None) == (args.formats is None):
        parser.error("give one of --format or --formats")
    return args


def main_formats(args: argparse.Namespace) -> int:
    """--formats: the export Job of a run with spec.export; its verdict in the termination message."""
    from datagen_operator.api.outcome import StepOutcome
    from datagen_operator.api.reasons import Reason

    formats = [name.strip() for name in args.formats.split(",") if name.strip()]
    exclude = frozenset(flag.strip() for flag in args.exclude_flags.split(",") if flag.strip())
    output = Path(args.output)
    if not formats or set(formats) - set(FORMATS):
        outcome = StepOutcome(
            False, Reason.EXPORT_FAILED, f"--formats {args.formats!r}: each one of {', '.join(FORMATS)}"
        )
    elif not output.is_dir():
        outcome = StepOutcome(False, Reason.EXPORT_FAILED, f"{output}: not a directory")
    else:

        def codec() -> TextCodec:
            run_file = Path(args.run) if args.run else None
            return codec_from_tokenizer(load_run_tokenizer(output, run_file, args.tokenizer, args.trust_remote_code))

        selection = Selection(exclude, args.max_length, args.over_length)
        outcome = export_run(output, Path(args.out), formats, selection, codec)
    data = outcome.for_storage()
    if args.termination_log:
        Path(args.termination_log).write_bytes(data)
    sys.stdout.write(data.decode() + "\n")
    return EXIT_OK if outcome.passed else EXIT_FAILED_VERDICT


def unverified_refusal(output: Path, args: argparse.Namespace) -> tuple[str, int] | None:
    """Why OUTPUT is not exported, in one line, and the exit code; None to go ahead. An output with no record
    (a halted run's, or not a run's at all) has nothing to export. Otherwise the output is verified first, as
    `datagen verify` would here (prompts re-rendered where the tokenizer and dataset are found): training on
    data that failed a check is what this project exists to prevent, so that takes --allow-unverified."""
    from datagen_operator.checks.verify import nothing_to_verify, verify_here

    empty = nothing_to_verify(output)
    if empty is not None:
        return f"nothing to export: {empty[0]}", EXIT_BAD_INPUT
    if args.allow_unverified:
        return None
    try:
        verified = verify_here(
            output,
            Path(args.run) if args.run else output / "run.yaml",
            tokenizer_dir=args.tokenizer,
            trust_remote_code=args.trust_remote_code,
            fidelity=None,
        )
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
    from datagen_operator.checks.record_checks import ALL_FLAGS

    output, out_dir = Path(args.output), Path(args.out)
    exclude = frozenset(flag.strip() for flag in args.exclude_flags.split(",") if flag.strip())
    problems = []
    if not output.is_dir():
        problems.append(f"{output}: not a directory")
    if unknown := sorted(exclude - set(ALL_FLAGS)):
        problems.append(f"--exclude-flags: unknown {', '.join(unknown)}; known: {', '.join(ALL_FLAGS)}")
    if args.max_length is not None and args.max_length < 1:
        problems.append("--max-length must be positive")
    if out_dir.resolve() == output.resolve():
        problems.append("--out must not be the run's output directory")
    if ((out_dir / MANIFEST_NAME).exists() or any((out_dir / DATA_DIR).glob(PART_GLOB))) and not args.overwrite:
        problems.append(f"{out_dir} holds an export already: pass --overwrite to replace it")
    codec = None
    if not problems and args.export_format == "text":
        try:
            codec = codec_from_tokenizer(
                load_run_tokenizer(output, Path(args.run) if args.run else None, args.tokenizer, args.trust_remote_code)
            )
        except (ValueError, OSError) as error:
            problems.append(f"tokenizer: {error}")
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
    options = ExportOptions(
        export_format=args.export_format,
        selection=Selection(exclude, args.max_length, args.over_length),
        last_turn_only=args.last_turn_only,
        part_bytes=args.part_bytes,
    )
    manifest = export_output(output, out_dir, options, codec)
    summary = {
        "out": str(out_dir),
        "format": args.export_format,
        **manifest["counts"],
        "left_out_by": manifest["left_out"],
    }
    if not manifest["source"]["complete"]:
        summary["note"] = "the run is not complete: rows from uncompacted shards carry metadata.unfinished"
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return EXIT_OK
