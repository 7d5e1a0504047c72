"""One row per recorded turn (--rows turns, every format but conversations): the turn's prompt and completion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from datagen_operator.export.formats import (
    Selection,
    TokenColumns,
    completion_counts,
    exclusions,
    finish_types,
    row_metadata,
    speculators_row,
    text_row,
    token_columns,
    trl_table,
)
from datagen_operator.export.manifest import ExportTally, record_name
from datagen_operator.export.options import ExportOptions, TextCodec
from datagen_operator.export.reader import SourceBatch, iter_source_batches, prefetched
from datagen_operator.export.vocab_freq import TokenFrequency
from datagen_operator.export.writer import JsonlParts, ParquetParts

ROUNDTRIP_FAILED = "roundtrip_failed"
"""Why a text row's completion is not counted supervised: its text re-encodes to other ids (the manifest's
supervision.unsupervised_tokens)."""


@dataclass(frozen=True)
class _KeptTurns:
    """The rows of one batch that go out: their records and tokens, ids, turns and metadata."""

    records: pa.Table
    tokens: TokenColumns
    ids: list[str]
    samples: list[int]
    turns: list[int]
    metadata: list[dict[str, Any]]
    over_length: list[bool]
    unfinished: bool

    @property
    def tokens_total(self) -> int:
        return int(self.tokens.prompt_lengths.sum()) + int(self.tokens.completion_lengths.sum())


def turn_rows(
    output_dir: Path,
    turns_all: bool,
    options: ExportOptions,
    codec: TextCodec | None,
    parts: JsonlParts | ParquetParts,
    tally: ExportTally,
    frequency: TokenFrequency,
) -> None:
    """Each record its own row: the turn's prompt and its completion, `turn` in every row."""
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens)):
        kept = _kept_turns(batch, turns_all, options.selection, tally)
        if kept is None:
            continue
        _count_kept(kept, options, tally, frequency)
        if options.export_format == "trl":
            assert isinstance(parts, ParquetParts)
            records, turn_column = kept.records, pa.array(kept.turns, type=pa.int32())
            fields = records.column("source_fields")  # the dataset line's other fields, JSON text, in every format
            table = trl_table(records.column("id"), records.column("sample"), turn_column, kept.tokens, kept.metadata,
                              fields)  # fmt: skip
            parts.write_table(table, kept.tokens_total)
        elif options.export_format == "speculators":
            assert isinstance(parts, JsonlParts)
            parts.write_lines(_speculators_lines(kept), kept.tokens_total)
        else:
            assert isinstance(parts, JsonlParts) and codec is not None
            parts.write_lines(_text_lines(kept, options, codec, tally), kept.tokens_total)


def _kept_turns(batch: SourceBatch, turns_all: bool, selection: Selection, tally: ExportTally) -> _KeptTurns | None:
    """The batch's rows the selection keeps (None: none), every other one left out in `tally` by name."""
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
        return None
    keep = [row for row in range(records.num_rows) if row not in left_out] if left_out else range(records.num_rows)
    if left_out:
        records = records.take(pa.array(keep, type=pa.int64()))
        tokens = token_columns(records.column("input_ids"), records.column("output_ids"))
    prompt_tokens, completion_tokens = (
        records.column("prompt_tokens").to_pylist(),
        records.column("completion_tokens").to_pylist(),
    )
    flags = records.column("flags").to_pylist()
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
    kept_ids, kept_samples = [prompt_ids[row] for row in keep], [samples[row] for row in keep]
    kept_turns = [turns[row] or 0 for row in keep]
    return _KeptTurns(records, tokens, kept_ids, kept_samples, kept_turns, metadata, over_length, batch.unfinished)


def _count_kept(kept: _KeptTurns, options: ExportOptions, tally: ExportTally, frequency: TokenFrequency) -> None:
    prompt_total, completion_total = int(kept.tokens.prompt_lengths.sum()), int(kept.tokens.completion_lengths.sum())
    frequency.add(completion_counts(kept.tokens))
    tally.rows_written += len(kept.ids)
    tally.tokens_written += prompt_total + completion_total
    tally.prompt_tokens += prompt_total
    tally.completion_tokens += completion_total
    tally.rows_unfinished += len(kept.ids) if kept.unfinished else 0
    tally.rows_over_length_kept += sum(kept.over_length)
    if options.export_format != "text":
        tally.supervised_tokens += completion_total  # the mask is 1 over each completion, 0 elsewhere


def _speculators_lines(kept: _KeptTurns) -> list[bytes]:
    tokens, fields = kept.tokens, kept.records.column("source_fields").to_pylist()
    return [
        speculators_row(kept.ids[i], kept.samples[i], tokens.prompt(i), tokens.completion(i), kept.metadata[i],
                        turn=kept.turns[i], fields=fields[i])
        for i in range(len(kept.ids))
    ]  # fmt: skip


def _text_lines(kept: _KeptTurns, options: ExportOptions, codec: TextCodec, tally: ExportTally) -> list[bytes]:
    """The text rows; a completion whose text re-encodes to other ids is counted not supervised."""
    tokens, fields = kept.tokens, kept.records.column("source_fields").to_pylist()
    text_lines = []
    for i in range(len(kept.ids)):
        line = text_row(
            kept.ids[i], kept.samples[i], tokens.prompt(i), tokens.completion(i), kept.metadata[i],
            decode=codec.decode, encode=codec.encode, last_turn_only=options.last_turn_only, turn=kept.turns[i],
            fields=fields[i],
        )  # fmt: skip
        completion = len(tokens.completion(i))
        if b'"roundtrip_ok":false' in line:  # the trainer re-encodes it to other ids than the model's
            tally.roundtrip_failed += 1
            tally.not_supervised(ROUNDTRIP_FAILED, completion)
        else:
            tally.supervised_tokens += completion
        text_lines.append(line)
    if not options.last_turn_only:  # earlier answers a trainer finds in one text: its turn index counts them
        tally.history_answers += sum(kept.turns)
    return text_lines
