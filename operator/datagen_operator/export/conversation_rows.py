"""--rows conversations: one token row per whole conversation, its last turn's ids, the loss over every answer it
holds verbatim."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from datagen_operator.export.conversations import RERENDERED_SPAN, ConversationRow, conversation_row
from datagen_operator.export.formats import (
    TokenColumns,
    exclusion_reason,
    finish_types,
    is_over_length,
    row_metadata,
    speculators_masked_row,
    token_columns,
    trl_masked_table,
)
from datagen_operator.export.manifest import ExportTally
from datagen_operator.export.options import ExportOptions
from datagen_operator.export.reader import SourceBatch, iter_source_batches, prefetched
from datagen_operator.export.vocab_freq import TokenFrequency
from datagen_operator.export.whole import WholeConversations, last_turns, whole_conversations
from datagen_operator.export.writer import JsonlParts, ParquetParts


@dataclass
class _BuiltRows:
    """One batch's conversation rows that go out: the last turns' records (by index) and each row built."""

    records: pa.Table
    tokens: TokenColumns
    kept: list[int] = field(default_factory=list)
    rows: list[ConversationRow] = field(default_factory=list)
    metadata: list[dict[str, Any]] = field(default_factory=list)

    def column(self, name: str) -> list[Any]:
        values = self.records.column(name)
        out: list[Any] = (values.fill_null(0) if name == "turn" else values).to_pylist()
        return out


def conversation_rows(
    output_dir: Path,
    source: dict[str, Any],
    options: ExportOptions,
    parts: JsonlParts | ParquetParts,
    tally: ExportTally,
    frequency: TokenFrequency,
) -> None:
    """--rows conversations: one row per whole conversation, its last turn's tokens, the loss over every answer
    it holds verbatim (pass 2, after `whole_conversations`' pass 1)."""
    whole = whole_conversations(output_dir, source, options, tally, digests=True)
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens)):
        rows = last_turns(batch, whole)
        if not rows:
            continue
        built = _built_rows(batch, rows, whole, options, tally)
        if not built.kept:
            continue
        _write_rows(built, batch.unfinished, parts, tally, frequency)


def _built_rows(
    batch: SourceBatch, rows: list[int], whole: WholeConversations, options: ExportOptions, tally: ExportTally
) -> _BuiltRows:
    """The conversation row of each last turn in `rows`; one the options leave out counted in `tally`."""
    selection = options.selection
    records = batch.records.take(pa.array(rows, type=pa.int64()))
    built = _BuiltRows(records, token_columns(records.column("input_ids"), records.column("output_ids")))
    tokens = built.tokens
    prompt_ids, samples = built.column("id"), built.column("sample")
    finishes = finish_types(records.column("finish_reason"))
    prompt_tokens, completion_tokens = built.column("prompt_tokens"), built.column("completion_tokens")
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
        built.kept.append(i)
        built.rows.append(row)
        built.metadata.append(
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
    return built


def _write_rows(
    built: _BuiltRows, unfinished: bool, parts: JsonlParts | ParquetParts, tally: ExportTally, frequency: TokenFrequency
) -> None:
    kept, rows, metadata, tokens = built.kept, built.rows, built.metadata, built.tokens
    batch_tokens = sum(len(row.ids) for row in rows)
    supervised = [row.ids[row.mask.view(np.bool_)] for row in rows]
    frequency.add(np.bincount(np.concatenate(supervised)))
    tally.rows_written += len(kept)
    tally.tokens_written += batch_tokens
    tally.prompt_tokens += int(sum(len(tokens.prompt(i)) for i in kept))
    tally.completion_tokens += int(sum(len(tokens.completion(i)) for i in kept))
    tally.supervised_tokens += sum(len(ids) for ids in supervised)
    tally.rows_unfinished += len(kept) if unfinished else 0
    tally.rows_over_length_kept += sum(m["over_length"] for m in metadata)
    prompt_ids, samples, turns = built.column("id"), built.column("sample"), built.column("turn")
    fields = built.column("source_fields")  # the last turn's: every turn of a line has the same
    if isinstance(parts, ParquetParts):
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(row.ids) for row in rows], out=offsets[1:])
        table = trl_masked_table(
            pa.array([prompt_ids[i] for i in kept], type=pa.string()),
            pa.array([samples[i] for i in kept], type=pa.int32()),
            pa.array([turns[i] for i in kept], type=pa.int32()),
            np.concatenate([row.ids for row in rows]),
            offsets,
            np.concatenate([row.mask for row in rows]),
            metadata,
            pa.array([fields[i] for i in kept], type=pa.string()),
        )
        parts.write_table(table, batch_tokens)
        return
    lines = [
        speculators_masked_row(prompt_ids[i], samples[i], turns[i], row.ids, row.mask, meta, fields[i])
        for i, row, meta in zip(kept, rows, metadata, strict=True)
    ]
    parts.write_lines(lines, batch_tokens)
