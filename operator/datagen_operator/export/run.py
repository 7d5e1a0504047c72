"""`datagen export OUTPUT --format speculators|trl|text|conversations --out DIR`: the I/O shell around `formats`
and `conversations`."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa

from datagen_operator.api.commands import ExportCommand
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.api.step_program import add_shared_arguments, add_trust_remote_code, write_verdict
from datagen_operator.export import FORMATS
from datagen_operator.export.conversations import (
    MESSAGES_KEYS,
    NO_ANSWER_SPLIT,
    NOT_IN_DATASET,
    RERENDERED_POLICIES,
    RERENDERED_SPAN,
    ROWS,
    TRAINER_RERENDERED,
    TURNS_MISSING,
    ConversationIndex,
    TrainerRenderLoss,
    TurnShape,
    conversation_messages,
    conversation_row,
    conversation_verdict,
    conversations_line,
    tokens_digest,
    turn_cuts,
)
from datagen_operator.export.formats import (
    OVER_LENGTH_POLICIES,
    Selection,
    completion_counts,
    effective_flags,
    exclusion_reason,
    exclusions,
    finish_type,
    finish_types,
    id_buffers,
    is_over_length,
    list_lengths,
    row_metadata,
    speculators_masked_row,
    speculators_row,
    text_row,
    token_columns,
    trl_masked_table,
    trl_schema,
    trl_table,
)
from datagen_operator.export.manifest import (
    MANIFEST_NAME,
    ExportTally,
    build_manifest,
    describe_source,
    record_name,
    write_manifest,
)
from datagen_operator.export.reader import (
    BATCH_TOKENS,
    COLUMNS,
    SourceBatch,
    iter_source_batches,
    prefetched,
)
from datagen_operator.export.vocab_freq import JSON_NAME, NPY_NAME, TokenFrequency
from datagen_operator.export.writer import DEFAULT_PART_BYTES, PART_GLOB, JsonlParts, ParquetParts
from datagen_operator.output.layout import OutputLayout
from datagen_operator.prompts.draws import VariableDraws, variable_draws

if TYPE_CHECKING:
    from datagen_operator.api.outcome import StepOutcome
    from datagen_operator.prompts.conversation import AnswerSplit
    from datagen_operator.prompts.dataset import DatasetFormat, Prompt

DATA_DIR = "data"
"""Parts go in OUT/data/, alone: consumers that load every *.json/*.jsonl of a directory (speculators'
prepare-data) must not pick up the manifest or token_freq.json beside them."""
TOKEN_FORMATS = ("speculators", "trl")
"""The formats --rows conversations applies to: rows of exact token ids with a loss mask."""
ROUNDTRIP_FAILED = "roundtrip_failed"
"""Why a text row's completion is not counted supervised: its text re-encodes to other ids (the manifest's
supervision.unsupervised_tokens)."""
ANSWER_BUDGET_BYTES = 256 * 1024 * 1024
"""The conversations format holds answers (their text) up to about this much before it writes the conversations
they complete, reading the dataset once per such round."""


@dataclass(frozen=True)
class DatasetSource:
    """The run's dataset: what the planned turns and the conversations format's messages are read from."""

    path: Path
    format: DatasetFormat = "auto"
    id_field: str | None = None
    draws: VariableDraws | None = None
    """generation.templateVariableMix: each line's drawn variables are in its prompt's (prompt_from)."""

    def prompts(self, wanted: set[str]) -> Iterator[Prompt]:
        """The valid prompts whose id is in `wanted`, in dataset order (one streamed pass)."""
        from datagen_operator.prompts.dataset import MalformedLine, ShardScan, prompt_from

        for item in ShardScan(self.path, 0, 1, self.format, id_field=self.id_field):
            if isinstance(item, MalformedLine):
                continue
            ref, obj = item
            if ref.id in wanted:
                yield prompt_from(ref, obj, self.draws)


@dataclass(frozen=True)
class ExportOptions:
    export_format: str
    selection: Selection = field(default_factory=Selection)
    last_turn_only: bool = False
    part_bytes: int = DEFAULT_PART_BYTES
    batch_tokens: int = BATCH_TOKENS
    rows: str = "turns"  # conversations.ROWS; the token formats only
    rerendered_spans: str = "unmasked"  # conversations.RERENDERED_POLICIES
    dataset: DatasetSource | None = None  # planned turns (whole conversations) and the conversations format's messages
    messages_key: str = "conversations"  # conversations.MESSAGES_KEYS

    def to_json(self) -> dict[str, Any]:
        selection = asdict(self.selection)
        selection["exclude_flags"] = sorted(self.selection.exclude_flags)
        whole = self.rows == "conversations" or self.export_format == "conversations"
        out = {
            **selection,
            "last_turn_only": self.last_turn_only,
            # Token formats always supervise the completion only: that IS the last assistant turn.
            "last_turn_only_applies": self.export_format == "text",
            "part_bytes": self.part_bytes,
            "rows": "conversations" if self.export_format == "conversations" else self.rows,
            "dataset": str(self.dataset.path) if self.dataset is not None and whole else None,
        }
        if self.rows == "conversations":
            out["rerendered_spans"] = self.rerendered_spans
        if self.export_format == "conversations":
            out["messages_key"] = self.messages_key
            out["max_length_applies"] = False  # the trainer renders the text: its own max_length cuts
        return out


ConversationRender = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any] | None], list[int]]
"""(messages, tools, chat_template_kwargs) -> the ids a template-based trainer trains on for the whole conversation."""


@dataclass(frozen=True)
class TextCodec:
    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]
    vocab_size: int | None
    render_conversation: ConversationRender | None = None


def codec_from_tokenizer(tokenizer: Any) -> TextCodec:
    from datagen_operator.prompts.render import backend_encoder

    # No special tokens added: the decoded text already holds the template's own (BOS included, if any).
    encode = backend_encoder(tokenizer) or (lambda text: tokenizer.encode(text, add_special_tokens=False))

    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text

    def render_conversation(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None
    ) -> list[int]:
        # As SpecForge's GeneralParser/ThinkingParser (specforge/data/parse.py) and TRL's `messages` render a
        # conversation to train on: the whole of it, no generation prompt, then the text tokenized.
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=False, **(kwargs or {})
        )
        return list(encode(text))

    return TextCodec(decode, encode, len(tokenizer), render_conversation)


def options_problem(options: ExportOptions, source_turns: str) -> str | None:
    """Why these options cannot export this output (its `generation.turns`), or None."""
    if options.export_format not in FORMATS:
        return f"unknown format {options.export_format!r}; one of {', '.join(FORMATS)}"
    if options.rows not in ROWS:
        return f"unknown --rows {options.rows!r}; one of {', '.join(ROWS)}"
    if options.rerendered_spans not in RERENDERED_POLICIES:
        return f"unknown --rerendered-spans {options.rerendered_spans!r}; one of {', '.join(RERENDERED_POLICIES)}"
    if options.messages_key not in MESSAGES_KEYS:
        return f"unknown --messages-key {options.messages_key!r}; one of {', '.join(MESSAGES_KEYS)}"
    if options.rows == "conversations" and options.export_format not in TOKEN_FORMATS:
        return (
            f"--rows conversations is for the token formats ({', '.join(TOKEN_FORMATS)}); "
            "--format conversations writes whole conversations as text"
        )
    whole = options.rows == "conversations" or options.export_format == "conversations"
    if whole and source_turns != "all":
        return (
            "whole conversations are exported from an output of generation.turns: all (regenerated conversations); "
            f"this one is generation.turns: {source_turns} (one answer per line: --rows turns)"
        )
    if options.export_format == "conversations" and options.dataset is None:
        return "the conversations format needs the run's dataset (its user turns): pass --dataset FILE"
    return None


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
            trainer_render = _conversation_texts(output_dir, source, options, parts, tally, frequency, codec)
        elif options.rows == "conversations":
            _conversation_rows(output_dir, source, options, parts, tally, frequency)
        else:
            _turn_rows(output_dir, source["turns"] == "all", options, codec, parts, tally, frequency)
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


# --- one row per recorded turn ----------------------------------------------------------------------


def _turn_rows(
    output_dir: Path,
    turns_all: bool,
    options: ExportOptions,
    codec: TextCodec | None,
    parts: JsonlParts | ParquetParts,
    tally: ExportTally,
    frequency: TokenFrequency,
) -> None:
    """Each record its own row: the turn's prompt and its completion, `turn` in every row."""
    selection = options.selection
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens)):
        records = batch.records
        tally.records_read += records.num_rows
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        turns = records.column("turn").to_pylist()
        finishes = finish_types(records.column("finish_reason"))
        tokens = token_columns(records.column("input_ids"), records.column("output_ids"))
        lengths = tokens.prompt_lengths + tokens.completion_lengths
        generated = tokens.completion_lengths
        tally.generated_tokens += int(generated.sum())
        left_out = exclusions(records.column("flags"), finishes, lengths, selection)
        for row, reason in left_out.items():
            name = record_name(prompt_ids[row], samples[row], turns[row] or 0, turns_all=turns_all)
            tally.leave_out(reason, name, int(generated[row]))
        if len(left_out) == records.num_rows:
            continue
        keep = [row for row in range(records.num_rows) if row not in left_out] if left_out else range(records.num_rows)
        if left_out:
            records = records.take(pa.array(keep, type=pa.int64()))
            tokens = token_columns(records.column("input_ids"), records.column("output_ids"))
        kept_ids, kept_samples = [prompt_ids[row] for row in keep], [samples[row] for row in keep]
        kept_turns = [turns[row] or 0 for row in keep]
        prompt_tokens, completion_tokens = (
            records.column("prompt_tokens").to_pylist(),
            records.column("completion_tokens").to_pylist(),
        )
        flags = records.column("flags").to_pylist()
        fields = records.column("source_fields")  # the dataset line's other fields, JSON text, in every format
        over_length = (
            (lengths[keep] > selection.max_length).tolist() if selection.max_length is not None else [False] * len(keep)
        )
        metadata = [
            row_metadata(
                finishes[row],
                prompt_tokens[i],
                completion_tokens[i],
                flags[i] or [],
                unfinished=batch.unfinished,
                over_length=over_length[i],
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
        tally.rows_over_length_kept += sum(over_length)
        if options.export_format != "text":
            tally.supervised_tokens += completion_total  # the mask is 1 over each completion, 0 elsewhere
        if options.export_format == "trl":
            assert isinstance(parts, ParquetParts)
            turn_column = pa.array(kept_turns, type=pa.int32())
            table = trl_table(records.column("id"), records.column("sample"), turn_column, tokens, metadata, fields)
            parts.write_table(table, prompt_total + completion_total)
            continue
        assert isinstance(parts, JsonlParts)
        field_texts = fields.to_pylist()
        if options.export_format == "speculators":
            lines = [
                speculators_row(kept_ids[i], kept_samples[i], tokens.prompt(i), tokens.completion(i), metadata[i],
                                turn=kept_turns[i], fields=field_texts[i])
                for i in range(len(keep))
            ]  # fmt: skip
            parts.write_lines(lines, prompt_total + completion_total)
            continue
        assert codec is not None
        text_lines = []
        for i in range(len(keep)):
            line = text_row(
                kept_ids[i], kept_samples[i], tokens.prompt(i), tokens.completion(i), metadata[i],
                decode=codec.decode, encode=codec.encode, last_turn_only=options.last_turn_only, turn=kept_turns[i],
                fields=field_texts[i],
            )  # fmt: skip
            completion = len(tokens.completion(i))
            if b'"roundtrip_ok":false' in line:  # the trainer re-encodes it to other ids than the model's
                tally.roundtrip_failed += 1
                tally.not_supervised(ROUNDTRIP_FAILED, completion)
            else:
                tally.supervised_tokens += completion
            text_lines.append(line)
        if not options.last_turn_only:  # earlier answers a trainer finds in one text: its turn index counts them
            tally.history_answers += sum(kept_turns)
        parts.write_lines(text_lines, prompt_total + completion_total)


# --- whole conversations (generation.turns: all) ------------------------------------------------------


def _index_conversations(
    output_dir: Path, source: dict[str, Any], options: ExportOptions, tally: ExportTally, *, digests: bool
) -> ConversationIndex:
    """Pass 1: the shape of every record (no tokens kept: their lengths and, for token rows, a digest)."""
    settled = {int(index) for index, entry in source["shards"].items() if entry.get("state") == "complete"}
    columns = COLUMNS if digests else ("id", "sample", "turn", "finish_reason", "flags", "output_ids")
    index = ConversationIndex()
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens, columns)):
        records = batch.records
        tally.records_read += records.num_rows
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        turns = records.column("turn").fill_null(0).to_pylist()
        finishes = [finish_type(value) for value in records.column("finish_reason").to_pylist()]
        flags = records.column("flags").to_pylist()
        tokens = token_columns(records.column("input_ids"), records.column("output_ids")) if digests else None
        generated = list_lengths(records.column("output_ids"))
        tally.generated_tokens += int(generated.sum())
        for row in range(records.num_rows):
            if tokens is not None:
                prompt, completion = tokens.prompt(row), tokens.completion(row)
                lengths, digest = (len(prompt), len(completion)), tokens_digest(prompt, completion)
            else:
                lengths, digest = (0, int(generated[row])), None
            shape = TurnShape(
                *lengths,
                digest,
                effective_flags(flags[row] or (), finishes[row]),
                settled=batch.shard in settled,
                unfinished=batch.unfinished,
            )
            index.add(prompt_ids[row], samples[row], turns[row], shape)
    tally.conversations_read = len(index.turns)
    return index


def _planned_turns(dataset: DatasetSource | None, ids: set[str]) -> dict[str, int] | None:
    """id -> the turns its dataset line plans (`plan_turns`), for the ids asked; None without the dataset."""
    if dataset is None:
        return None
    from datagen_operator.prompts.conversation import plan_turns

    return {prompt.id: len(plan_turns(prompt.messages)) for prompt in dataset.prompts(ids)}


def whole_conversations(
    output_dir: Path, source: dict[str, Any], options: ExportOptions, tally: ExportTally, *, digests: bool
) -> dict[tuple[str, int], tuple[int, list[TurnShape]]]:
    """(id, sample) -> (its last turn, the shapes of its earlier turns in order) for every conversation exported
    whole; every other one left out in `tally` with its reason (conversations.conversation_verdict)."""
    from datagen_operator.output.readers import iter_rejects

    index = _index_conversations(output_dir, source, options, tally, digests=digests)
    cuts = turn_cuts(iter_rejects(output_dir))
    planned = _planned_turns(options.dataset, index.ids())
    whole: dict[tuple[str, int], tuple[int, list[TurnShape]]] = {}
    for key, recorded in index.turns.items():
        name = f"{key[0]}#{key[1]}"
        generated = sum(shape.completion_length for shape in recorded.values())
        if planned is not None and key[0] not in planned:
            tally.leave_out(NOT_IN_DATASET, name, generated)
            continue
        reason = conversation_verdict(recorded, planned[key[0]] if planned is not None else None, cuts.get(key, {}))
        if reason is not None:
            tally.leave_out(reason, name, generated)
            continue
        last = max(recorded)
        whole[key] = (last, [recorded[turn] for turn in range(last)])
    return whole


def _last_turns(batch: SourceBatch, whole: dict[tuple[str, int], tuple[int, list[TurnShape]]]) -> list[int]:
    """The rows of a batch that are the last turn of a conversation exported whole."""
    records = batch.records
    prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
    turns = records.column("turn").fill_null(0).to_pylist()
    return [
        row
        for row, key in enumerate(zip(prompt_ids, samples, strict=True))
        if key in whole and whole[key][0] == turns[row]
    ]


def _conversation_rows(
    output_dir: Path,
    source: dict[str, Any],
    options: ExportOptions,
    parts: JsonlParts | ParquetParts,
    tally: ExportTally,
    frequency: TokenFrequency,
) -> None:
    """--rows conversations: one row per whole conversation, its last turn's tokens, the loss over every answer
    it holds verbatim (pass 2, after `whole_conversations`' pass 1)."""
    selection = options.selection
    whole = whole_conversations(output_dir, source, options, tally, digests=True)
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens)):
        rows = _last_turns(batch, whole)
        if not rows:
            continue
        records = batch.records.take(pa.array(rows, type=pa.int64()))
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        turns = records.column("turn").fill_null(0).to_pylist()
        finishes = [finish_type(value) for value in records.column("finish_reason").to_pylist()]
        prompt_tokens, completion_tokens = (
            records.column("prompt_tokens").to_pylist(),
            records.column("completion_tokens").to_pylist(),
        )
        tokens = token_columns(records.column("input_ids"), records.column("output_ids"))
        fields = records.column("source_fields").to_pylist()  # the last turn's: every turn of a line has the same
        kept: list[int] = []
        built = []
        metadata = []
        for i in range(records.num_rows):
            name = f"{prompt_ids[i]}#{samples[i]}"
            earlier = whole[(prompt_ids[i], samples[i])][1]
            row = conversation_row(tokens.prompt(i), tokens.completion(i), earlier)
            generated = len(tokens.completion(i)) + sum(shape.completion_length for shape in earlier)
            tally.conversation_spans_rerendered += row.spans_rerendered
            if row.spans_rerendered and options.rerendered_spans == "drop-row":
                tally.leave_out(RERENDERED_SPAN, name, generated)
                continue
            reason = exclusion_reason(frozenset(), len(row.ids), selection)
            if reason is not None:
                tally.leave_out(reason, name, generated)
                continue
            tally.conversation_spans_verbatim += row.spans_supervised - 1
            tally.not_supervised(RERENDERED_SPAN, row.tokens_rerendered)
            kept.append(i)
            built.append(row)
            metadata.append(
                row_metadata(
                    finishes[i],
                    prompt_tokens[i],
                    completion_tokens[i],
                    [],  # a conversation with a flagged turn is not exported whole
                    unfinished=batch.unfinished,
                    over_length=is_over_length(len(row.ids), selection),
                    spans_supervised=row.spans_supervised,
                    spans_rerendered=row.spans_rerendered,
                )
            )
        if not kept:
            continue
        batch_tokens = sum(len(row.ids) for row in built)
        supervised = [row.ids[row.mask.view(np.bool_)] for row in built]
        frequency.add(np.bincount(np.concatenate(supervised)))
        tally.rows_written += len(kept)
        tally.tokens_written += batch_tokens
        tally.prompt_tokens += int(sum(len(tokens.prompt(i)) for i in kept))
        tally.completion_tokens += int(sum(len(tokens.completion(i)) for i in kept))
        tally.supervised_tokens += sum(len(ids) for ids in supervised)
        tally.rows_unfinished += len(kept) if batch.unfinished else 0
        tally.rows_over_length_kept += sum(m["over_length"] for m in metadata)
        if isinstance(parts, ParquetParts):
            offsets = np.zeros(len(built) + 1, dtype=np.int64)
            np.cumsum([len(row.ids) for row in built], out=offsets[1:])
            table = trl_masked_table(
                pa.array([prompt_ids[i] for i in kept], type=pa.string()),
                pa.array([samples[i] for i in kept], type=pa.int32()),
                pa.array([turns[i] for i in kept], type=pa.int32()),
                np.concatenate([row.ids for row in built]),
                offsets,
                np.concatenate([row.mask for row in built]),
                metadata,
                pa.array([fields[i] for i in kept], type=pa.string()),
            )
            parts.write_table(table, batch_tokens)
            continue
        lines = [
            speculators_masked_row(prompt_ids[i], samples[i], turns[i], row.ids, row.mask, meta, fields[i])
            for i, row, meta in zip(kept, built, metadata, strict=True)
        ]
        parts.write_lines(lines, batch_tokens)


def _conversation_texts(
    output_dir: Path,
    source: dict[str, Any],
    options: ExportOptions,
    parts: JsonlParts,
    tally: ExportTally,
    frequency: TokenFrequency,
    codec: TextCodec | None,
) -> TrainerRenderLoss | None:
    """--format conversations: each whole conversation as messages (the dataset's inputs as planned, the model's
    answers as the next turn's history held them), in dataset order. With a codec that renders, what a
    template-based trainer loses of them is measured (None without)."""
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.render import fingerprint_template_kwargs

    dataset = options.dataset
    assert dataset is not None
    # What the run rendered every prompt with: each row carries it, its line's own kwargs over it.
    run_kwargs = fingerprint_template_kwargs((read_manifest(output_dir) or {}).get("fingerprint") or {})
    whole = whole_conversations(output_dir, source, options, tally, digests=False)
    render = codec.render_conversation if codec is not None else None
    loss = TrainerRenderLoss() if render is not None else None
    pending = _PendingAnswers(whole)
    columns = (*ANSWER_READ, "input_ids") if render is not None else ANSWER_READ
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens, columns)):
        records = batch.records
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        turns = records.column("turn").fill_null(0).to_pylist()
        contents = records.column("answer_content").to_pylist()
        reasonings = records.column("answer_reasoning").to_pylist()
        calls = records.column("answer_tool_calls").to_pylist()
        fields = records.column("source_fields").to_pylist()
        values, offsets = id_buffers(records.column("output_ids"))
        if render is not None:
            prompt_values, prompt_offsets = id_buffers(records.column("input_ids"))
        for row, key in enumerate(zip(prompt_ids, samples, strict=True)):
            if key in whole and turns[row] <= whole[key][0]:
                completion = values[offsets[row] : offsets[row + 1]]
                frequency.add(np.bincount(completion))
                stored = {"answer_content": contents[row], "answer_reasoning": reasonings[row]}
                stored["answer_tool_calls"] = calls[row]
                pending.add(key, turns[row], stored, len(completion), batch.unfinished, fields[row])
                if render is not None:
                    prompt = prompt_values[prompt_offsets[row] : prompt_offsets[row + 1]]
                    digest = tokens_digest(prompt, completion)
                    shape = TurnShape(len(prompt), len(completion), digest, frozenset(), True, batch.unfinished)
                    pending.shapes.setdefault(key, {})[turns[row]] = shape
        if pending.held >= ANSWER_BUDGET_BYTES:
            _write_conversations(dataset, options, pending, parts, tally, run_kwargs, render, loss)
    _write_conversations(dataset, options, pending, parts, tally, run_kwargs, render, loss)
    for key in pending.answers:  # never all read: cannot happen for a conversation found whole
        tally.leave_out(TURNS_MISSING, f"{key[0]}#{key[1]}", pending.completion_tokens.get(key, 0))
    return loss


ANSWER_READ = (
    "id", "sample", "turn", "output_ids", "answer_content", "answer_reasoning", "answer_tool_calls", "source_fields",
)  # fmt: skip


def _split_size(split: AnswerSplit) -> int:
    """About what an answer holds in memory, in characters."""
    calls = sum(len(call.name) + len(call.arguments) for call in split.tool_calls)
    return len(split.content) + len(split.reasoning_content or "") + calls


class _PendingAnswers:
    """Answers of whole conversations read so far, until their conversation is written."""

    def __init__(self, whole: dict[tuple[str, int], tuple[int, list[TurnShape]]]) -> None:
        self.whole = whole
        self.answers: dict[tuple[str, int], dict[int, AnswerSplit]] = {}
        self.no_split: set[tuple[str, int]] = set()
        self.unfinished: set[tuple[str, int]] = set()
        self.completion_tokens: dict[tuple[str, int], int] = {}
        self.fields: dict[tuple[str, int], str] = {}  # its records' source_fields (every turn's are its line's)
        self.shapes: dict[tuple[str, int], dict[int, TurnShape]] = {}  # with a trainer render to measure against
        self.held = 0

    def add(
        self, key: tuple[str, int], turn: int, stored: dict[str, Any], tokens: int, unfinished: bool, fields: str | None
    ) -> None:
        """`stored`: the record's answer columns (output/readers.py `stored_split` reads them)."""
        from datagen_operator.output.readers import stored_split

        if stored["answer_content"] is None:
            self.no_split.add(key)
        split = stored_split(stored)
        self.answers.setdefault(key, {})[turn] = split
        self.completion_tokens[key] = self.completion_tokens.get(key, 0) + tokens
        if unfinished:
            self.unfinished.add(key)
        if fields is not None:
            self.fields[key] = fields
        self.held += _split_size(split)

    def ready(self) -> dict[str, list[int]]:
        """id -> samples whose every turn is read."""
        out: dict[str, list[int]] = {}
        for key, got in self.answers.items():
            if len(got) == self.whole[key][0] + 1:
                out.setdefault(key[0], []).append(key[1])
        return out

    def take(self, key: tuple[str, int]) -> tuple[list[AnswerSplit], int, bool, bool, str | None]:
        """Its answers in turn order, completion tokens, whether unfinished, whether a split was missing, and its
        records' source_fields."""
        got = self.answers.pop(key)
        self.held -= sum(_split_size(answer) for answer in got.values())
        split_missing = key in self.no_split
        self.no_split.discard(key)
        unfinished = key in self.unfinished
        self.unfinished.discard(key)
        answers = [got[turn] for turn in sorted(got)]
        return answers, self.completion_tokens.pop(key, 0), unfinished, split_missing, self.fields.pop(key, None)


def _write_conversations(
    dataset: DatasetSource,
    options: ExportOptions,
    pending: _PendingAnswers,
    parts: JsonlParts,
    tally: ExportTally,
    run_kwargs: dict[str, Any],
    render: ConversationRender | None = None,
    loss: TrainerRenderLoss | None = None,
) -> None:
    """Write the conversations whose answers are all read, their inputs read from the dataset (one pass).
    `run_kwargs`: the chat-template keyword arguments of the run (prompts/render.py fingerprint_template_kwargs);
    `render` and `loss`: each conversation rendered as a template-based trainer renders it, its loss counted."""
    from datagen_operator.prompts.conversation import plan_turns
    from datagen_operator.prompts.render import rendered_kwargs

    ready = pending.ready()
    if not ready:
        return
    lines: list[bytes] = []
    found: set[str] = set()
    for prompt in dataset.prompts(set(ready)):
        found.add(prompt.id)
        turns = plan_turns(prompt.messages)
        kwargs = rendered_kwargs(run_kwargs, prompt.variables) or None
        for sample in sorted(ready[prompt.id]):
            answers, completion_tokens, unfinished, split_missing, fields = pending.take((prompt.id, sample))
            shapes = pending.shapes.pop((prompt.id, sample), {})
            name = f"{prompt.id}#{sample}"
            if split_missing:
                tally.leave_out(NO_ANSWER_SPLIT, name, completion_tokens)
                continue
            messages = conversation_messages(turns, answers)
            lost = 0
            if render is not None and loss is not None:
                try:
                    rendered: np.ndarray | None = np.asarray(render(messages, prompt.tools, kwargs), dtype=np.int32)
                except Exception:  # a template that refuses the conversation: nothing of it is trained on as written
                    rendered = None
                lost = loss.add(name, rendered, [shapes[turn] for turn in sorted(shapes)])
            metadata = {"turns": len(answers), "completion_tokens": completion_tokens, "unfinished": unfinished}
            lines.append(
                conversations_line(
                    prompt.id, sample, messages, prompt.tools, kwargs, metadata, options.messages_key, fields
                )
            )
            tally.rows_written += 1
            tally.completion_tokens += completion_tokens
            # Every answer is an assistant message (manifest.SUPERVISED_MEANS); where a trainer's render was
            # measured, the answers it does not hold verbatim are not what it supervises.
            tally.supervised_tokens += completion_tokens - lost
            if lost:
                tally.unsupervised[TRAINER_RERENDERED] += lost
            tally.rows_unfinished += unfinished
    for prompt_id in set(ready) - found:  # the dataset lost the line since its planned turns were read
        for sample in ready[prompt_id]:
            _, completion_tokens, _, _, _ = pending.take((prompt_id, sample))
            tally.leave_out(NOT_IN_DATASET, f"{prompt_id}#{sample}", completion_tokens)
            pending.shapes.pop((prompt_id, sample), None)
    parts.write_lines(lines, 0)


# --- spec.export: every asked format after a run's final verification ---------------------------------


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
    from datagen_operator.checks.verify import load_run_spec

    spec = load_run_spec(output, run_file)
    form: DatasetFormat = spec.dataset.format if spec is not None else "auto"
    id_field = spec.dataset.id_field if spec is not None else None
    draws = variable_draws(spec.generation.template_variable_mix) if spec is not None else None
    if dataset:
        path = Path(dataset)
        if not path.is_file():
            return None, f"--dataset {dataset}: not a file"
        return DatasetSource(path, form, id_field, draws), ""
    if spec is None:
        return None, f"no {run_file or OutputLayout(output).run_file} to find the dataset from: pass --dataset FILE"
    found, notes = on_this_machine(spec, output)
    if found is None:
        return None, "; ".join(notes) or "the run's dataset is not found here: pass --dataset FILE"
    return DatasetSource(found, form, id_field, draws), ""


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
        dataset, why = (None, "")
        if "conversations" in formats or args.rows == "conversations" or args.dataset:
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
    from datagen_operator.checks.verify import nothing_to_verify, verify_as_asked

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
    if not problems and args.export_format == "conversations":
        try:  # to measure what a template-based trainer keeps of the conversations; without it, not measured
            codec = codec_from_tokenizer(
                load_run_tokenizer(output, Path(args.run) if args.run else None, args.tokenizer, args.trust_remote_code)
            )
        except (ValueError, OSError) as error:
            print(f"warning: not measuring what a trainer rendering the conversations keeps: {error}", file=sys.stderr)
    if not problems and args.export_format == "text":
        try:
            codec = codec_from_tokenizer(
                load_run_tokenizer(output, Path(args.run) if args.run else None, args.tokenizer, args.trust_remote_code)
            )
        except (ValueError, OSError) as error:
            problems.append(f"tokenizer: {error}")
    dataset = None
    whole = args.rows == "conversations" or args.export_format == "conversations"
    if not problems and (whole or args.dataset):
        dataset, why = find_dataset(output, Path(args.run) if args.run else None, args.dataset)
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
    supervision = manifest["supervision"]
    for warning in loss_warnings(manifest, run_family(output)):
        print(f"warning: {warning}", file=sys.stderr)
    summary = {
        "out": str(out_dir),
        "format": args.export_format,
        "family": manifest["source"]["preset"],
        "supervision": supervision["line"],  # supervised / generated tokens, the ratio, and why below 1
        "supervised_ratio": supervision["ratio"],
        **manifest["counts"],
        "left_out_by": manifest["left_out"],
        "unsupervised_tokens_by": supervision["unsupervised_tokens"],
    }
    if not manifest["source"]["complete"]:
        summary["note"] = "the run is not complete: rows from uncompacted shards carry metadata.unfinished"
    sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return EXIT_OK
