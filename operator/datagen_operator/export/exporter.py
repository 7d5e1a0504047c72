"""One output to one format (`export_output`: the rows, the parts, the manifest) and to every format of spec.export
(`export_run`: the Exported verdict); what a consumer would not train on, in words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datagen_operator.export.conversation_rows import conversation_rows
from datagen_operator.export.conversation_texts import conversation_texts
from datagen_operator.export.conversations import RERENDERED_SPAN, turn_cuts
from datagen_operator.export.formats import Selection, trl_schema
from datagen_operator.export.manifest import MANIFEST_NAME, ExportTally, build_manifest, describe_source, write_manifest
from datagen_operator.export.options import TOKEN_FORMATS, DatasetSource, ExportOptions, TextCodec, options_problem
from datagen_operator.export.turn_rows import turn_rows
from datagen_operator.export.vocab_freq import JSON_NAME, NPY_NAME, TokenFrequency
from datagen_operator.export.writer import PART_GLOB, JsonlParts, ParquetParts

if TYPE_CHECKING:
    from datagen_operator.api.outcome import StepOutcome

DATA_DIR = "data"
"""Parts go in OUT/data/, alone: consumers that load every *.json/*.jsonl of a directory (speculators'
prepare-data) must not pick up the manifest or token_freq.json beside them."""


def export_output(
    output_dir: str | Path, out_dir: str | Path, options: ExportOptions, codec: TextCodec | None = None
) -> dict[str, Any]:
    """Export every record of the run once (minus what the selection leaves out); returns the manifest."""
    output_dir, out_dir = Path(output_dir), Path(out_dir)
    source = describe_source(output_dir)
    problem = options_problem(options, source["turns"])
    if problem is not None:
        raise ValueError(problem)
    if options.export_format == "text" and codec is None:
        raise ValueError("the text format needs the run's tokenizer")
    data_dir = out_dir / DATA_DIR
    data_dir.mkdir(parents=True, exist_ok=True)
    tally, frequency = ExportTally(), TokenFrequency()
    parts: JsonlParts | ParquetParts = (
        ParquetParts(data_dir, trl_schema(), options.part_bytes)
        if options.export_format == "trl"
        else JsonlParts(data_dir, options.part_bytes)
    )
    if source["turns"] == "all":
        tally.turns_not_generated.update(_turns_never_sent(output_dir))
    try:
        if options.export_format == "conversations":
            assert isinstance(parts, JsonlParts)
            trainer_render = conversation_texts(output_dir, source, options, parts, tally, frequency, codec)
        elif options.rows == "conversations":
            conversation_rows(output_dir, source, options, parts, tally, frequency)
        else:
            turn_rows(output_dir, source["turns"] == "all", options, codec, parts, tally, frequency)
    finally:
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
    if options.export_format == "conversations":
        manifest["trainer_render"] = (
            {"measured": True, **trainer_render.to_json()}
            if trainer_render is not None
            else {"measured": False, "why": "no tokenizer to render with (--tokenizer DIR)"}
        )
    write_manifest(out_dir, manifest)
    return manifest


def _turns_never_sent(output_dir: Path) -> Counter[str]:
    """Planned turns the worker never sent, by cause (rejects.jsonl: `turns_cut:<cause>`, `turn_refused`): no
    format can supervise them, as the model never generated them (a conversation ends at a tool call part-way,
    an unfinished answer...)."""
    from datagen_operator.output.readers import iter_rejects

    return Counter(reason for cut in turn_cuts(iter_rejects(output_dir)).values() for reason in cut.values())


def loss_warnings(manifest: dict[str, Any], family: str | None) -> list[str]:
    """What a consumer of this export would not train on, in words (`datagen export` prints them): the answers a
    template-based trainer re-renders (--format conversations, measured) and the earlier answers a
    whole-conversation row holds re-rendered (--rows conversations)."""
    model = f"{family}: " if family else ""
    per_turn = (
        "per-turn rows (--rows turns) of --format speculators (speculators prepare-data; SpecForge's prompts_path, "
        "its pre-tokenized path) or --format trl train on every answer once, as generated"
    )
    warnings = []
    render = manifest.get("trainer_render") or {}
    if render.get("tokens_lost"):
        warnings.append(
            f"{model}a trainer that renders these conversations with the model's chat template (SpecForge's "
            f"conversations loader, TRL's messages) does not train on {render['answers_lost']} of {render['answers']} "
            f"answers as the model wrote them ({render['tokens_lost']} of {render['tokens']} generated tokens, "
            f"reasoning included: the template re-renders them, e.g. {', '.join(render['examples'][:3])}); "
            f"{per_turn}"
        )
    if manifest["export_format"] == "text" and manifest["source"].get("turns") == "all":
        warnings.append(
            f"{model}a later turn's text holds the earlier answers as the template re-rendered them into history, "
            "and SpecForge's preformatted loader (--is-preformatted) supervises every assistant span it finds there, "
            "text the model did not generate in that place, unless told train_only_last_turn (which still "
            f"supervises a thinking prompt's own opener, Kimi's <think>); {per_turn}"
        )
    spans = manifest["counts"].get("conversation_spans_rerendered", 0)
    if spans:
        fate = (
            f"their {manifest['left_out'].get(RERENDERED_SPAN, 0)} conversations left out (drop-row)"
            if manifest["options"].get("rerendered_spans") == "drop-row"
            else "not supervised (mask 0)"
        )
        warnings.append(
            f"{model}{spans} earlier answers are held re-rendered by the chat template in these whole-conversation "
            f"rows: {fate}; {per_turn}"
        )
    return warnings


def run_family(output_dir: Path) -> str | None:
    """The run's preset, as its fingerprint records it (the family a warning names)."""
    from datagen_operator.output.manifest import read_manifest

    preset = ((read_manifest(output_dir) or {}).get("fingerprint") or {}).get("preset")
    return preset if isinstance(preset, str) else None


def export_run(
    output_dir: str | Path,
    root: str | Path,
    formats: Sequence[str],
    selection: Selection,
    codec: Callable[[], TextCodec],
    *,
    rows: str = "turns",
    rerendered_spans: str = "unmasked",
    dataset: DatasetSource | None = None,
) -> StepOutcome:
    """Each format to ROOT/<format>, replacing an earlier export there; the verdict for the Exported condition.

    `codec` is called only when the text format is asked for (it loads the run's tokenizer). `rows`,
    `rerendered_spans` and `dataset` as `datagen export` takes them (the conversations format needs `dataset`)."""
    from datagen_operator.api.outcome import StepOutcome
    from datagen_operator.api.reasons import Reason

    words = []
    try:
        for export_format in formats:
            out_dir = Path(root) / export_format
            if out_dir.is_dir():
                clear_previous_export(out_dir)
            options = ExportOptions(
                export_format=export_format,
                selection=selection,
                rows=rows if export_format in TOKEN_FORMATS else "turns",
                rerendered_spans=rerendered_spans,
                dataset=dataset,
            )
            manifest = export_output(output_dir, out_dir, options, _codec_for(export_format, codec))
            counts = manifest["counts"]
            left_out = sum(manifest["left_out"].values())
            words.append(f"{export_format}: {counts['rows_written']} rows, {counts['tokens_written']} tokens")
            words[-1] += f", {left_out} left out" if left_out else ""
            ratio = manifest["supervision"]["ratio"]
            words[-1] += f", supervised/generated {ratio:.2f}" if ratio is not None else ""
            render = manifest.get("trainer_render") or {}
            if render.get("tokens_lost"):  # loss_warnings' words, short: the condition message is one line
                words[-1] += (
                    f" ({render['tokens_lost']} of {render['tokens']} generated tokens lost to a trainer that "
                    "re-renders them: use speculators/trl per-turn rows)"
                )
    except (OSError, ValueError) as error:
        done = f" ({'; '.join(words)})" if words else ""
        return StepOutcome(False, Reason.EXPORT_FAILED, f"{export_format}: {error}{done}")
    return StepOutcome(True, Reason.EXPORTED, f"{'; '.join(words)} in {root}")


def _codec_for(export_format: str, codec: Callable[[], TextCodec]) -> TextCodec | None:
    """The text format needs the tokenizer; the conversations format measures with it where it loads."""
    if export_format == "text":
        return codec()
    if export_format == "conversations":
        try:
            return codec()
        except Exception:  # any tokenizer that does not load: the export goes on, its manifest says "not measured"
            return None
    return None


# --- command line -----------------------------------------------------------------------------------


def clear_previous_export(out_dir: Path) -> None:
    """Only what an export writes: a user's other files in DIR are never touched."""
    data_dir = out_dir / DATA_DIR
    for path in [*data_dir.glob(PART_GLOB), *data_dir.glob(f".{PART_GLOB}.tmp")]:
        path.unlink()
    for name in (MANIFEST_NAME, NPY_NAME, JSON_NAME):
        (out_dir / name).unlink(missing_ok=True)
