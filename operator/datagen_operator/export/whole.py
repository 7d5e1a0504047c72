"""Which conversations are exported whole (generation.turns: all): every record's shape read once, each conversation
judged against its planned turns and the turns the worker cut (conversations.conversation_verdict)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datagen_operator.api.flags import effective_flags
from datagen_operator.export.conversations import (
    NOT_IN_DATASET,
    ConversationIndex,
    TurnShape,
    conversation_verdict,
    tokens_digest,
    turn_cuts,
)
from datagen_operator.export.formats import finish_types, list_lengths, token_columns
from datagen_operator.export.manifest import ExportTally
from datagen_operator.export.options import DatasetSource, ExportOptions
from datagen_operator.export.reader import COLUMNS, SourceBatch, iter_source_batches, prefetched

WholeConversations = dict[tuple[str, int], tuple[int, list[TurnShape]]]
"""(id, sample) -> the conversation's last turn and the shapes of its earlier turns, in turn order."""


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
        finishes = finish_types(records.column("finish_reason"))
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
) -> WholeConversations:
    """(id, sample) -> (its last turn, the shapes of its earlier turns in order) for every conversation exported
    whole; every other one left out in `tally` with its reason (conversations.conversation_verdict)."""
    from datagen_operator.output.readers import iter_rejects

    index = _index_conversations(output_dir, source, options, tally, digests=digests)
    cuts = turn_cuts(iter_rejects(output_dir))
    planned = _planned_turns(options.dataset, index.ids())
    whole: WholeConversations = {}
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


def last_turns(batch: SourceBatch, whole: WholeConversations) -> list[int]:
    """The rows of a batch that are the last turn of a conversation exported whole."""
    records = batch.records
    prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
    turns = records.column("turn").fill_null(0).to_pylist()
    return [
        row
        for row, key in enumerate(zip(prompt_ids, samples, strict=True))
        if key in whole and whole[key][0] == turns[row]
    ]
