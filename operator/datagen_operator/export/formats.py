"""Pure row builders: a batch of stored records in, rows of one training format out. No I/O.

Every format carries the ids exactly as stored: `input_ids` is the rendered prompt followed by SGLang's
`output_ids` (which end in the stop token the model generated). The loss covers the completion, stop
token included, and is NOT shifted: trainers shift labels themselves, so a pre-shifted mask would drop
the first completion token and supervise the last prompt token.

Token work is done on whole columns with numpy (one batch at a time); only per-row bookkeeping (ids,
flags, finish reason) is Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

IGNORE_INDEX = -100  # what HF/TRL losses skip in `labels`
TRUNCATED = "truncated"  # the store's flag for finish_reason "length": no stop token at the end
OVER_LENGTH_POLICIES = ("drop", "keep-flagged")


# --- which rows go out ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    exclude_flags: frozenset[str] = frozenset()
    max_length: int | None = None
    over_length: str = "drop"  # OVER_LENGTH_POLICIES; never "cut": cutting the end removes the stop token


def finish_type(finish_reason_json: str | None) -> str | None:
    """SGLang's finish_reason type ("stop", "length", "abort") from the stored JSON."""
    if not finish_reason_json:
        return None
    value = orjson.loads(finish_reason_json)
    return value.get("type") if isinstance(value, dict) else None


def effective_flags(flags: Sequence[str], finish: str | None) -> frozenset[str]:
    """The stored flags, plus `truncated` whenever the row ended on `length` (it has no stop token)."""
    return frozenset(flags) | ({TRUNCATED} if finish == "length" else frozenset())


def exclusion_reason(flags: frozenset[str], length: int, selection: Selection) -> str | None:
    """Why a row is left out (`flag:<name>`, `over_length`), or None to export it."""
    hit = sorted(flags & selection.exclude_flags)
    if hit:
        return f"flag:{hit[0]}"
    if selection.max_length is not None and length > selection.max_length and selection.over_length == "drop":
        return "over_length"
    return None


def is_over_length(length: int, selection: Selection) -> bool:
    return selection.max_length is not None and length > selection.max_length


# --- tokens on whole columns ------------------------------------------------------------------------


def list_lengths(column: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)


def list_values(column: pa.Array) -> np.ndarray:
    """The flat int32 values of a (possibly sliced) list column; zero-copy where Arrow allows."""
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.int32)


@dataclass(frozen=True)
class JoinedTokens:
    """Each row's prompt then completion, flat, with row offsets and the completion positions."""

    ids: np.ndarray  # int32, all rows back to back
    loss_mask: np.ndarray  # uint8, 0 over the prompt, 1 over the completion (stop token included)
    offsets: np.ndarray  # int64, len rows + 1
    prompt_lengths: np.ndarray
    completion_lengths: np.ndarray

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.offsets[index], self.offsets[index + 1]
        return self.ids[start:end], self.loss_mask[start:end]


def join_tokens(input_ids: pa.Array, output_ids: pa.Array) -> JoinedTokens:
    prompt_lengths, completion_lengths = list_lengths(input_ids), list_lengths(output_ids)
    rows = len(prompt_lengths)
    # Alternate (prompt, completion) runs: repeat 0/1 by their lengths gives the mask of the whole batch.
    runs = np.empty(2 * rows, dtype=np.int64)
    runs[0::2], runs[1::2] = prompt_lengths, completion_lengths
    loss_mask = np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), rows), runs)
    in_completion = loss_mask.view(np.bool_)
    ids = np.empty(len(loss_mask), dtype=np.int32)
    ids[~in_completion] = list_values(input_ids)  # rows stay in order, so a masked assign places them
    ids[in_completion] = list_values(output_ids)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(prompt_lengths + completion_lengths, out=offsets[1:])
    return JoinedTokens(ids, loss_mask, offsets, prompt_lengths, completion_lengths)


def labels_for(joined: JoinedTokens) -> np.ndarray:
    """HF `labels`: the id where the loss applies, IGNORE_INDEX elsewhere (unshifted, as `input_ids`)."""
    return np.where(joined.loss_mask.view(np.bool_), joined.ids, IGNORE_INDEX).astype(np.int32)


def completion_counts(joined: JoinedTokens) -> np.ndarray:
    """Occurrences of each id among the supervised (completion) tokens: the drafter's vocabulary counts."""
    return np.bincount(joined.ids[joined.loss_mask.view(np.bool_)])


# --- per-format rows --------------------------------------------------------------------------------


def row_metadata(
    finish: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    flags: Sequence[str],
    *,
    unfinished: bool,
    over_length: bool,
) -> dict[str, Any]:
    """Flat and schema-stable: every key in every row, so column-inferring loaders see one schema."""
    return {
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "flags": list(flags),
        "unfinished": unfinished,  # read from a segment of a shard that was not compacted yet
        "over_length": over_length,  # longer than --max-length, kept whole (--over-length keep-flagged)
    }


def speculators_row(
    prompt_id: str, sample: int, ids: np.ndarray, loss_mask: np.ndarray, metadata: dict[str, Any]
) -> bytes:
    """One JSONL line for vLLM speculators (>= 0.7.0 pre-tokenized rows) and SpecForge main."""
    row = {"id": prompt_id, "sample": sample, "input_ids": ids, "loss_mask": loss_mask, "metadata": metadata}
    return orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)


def _list_array(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def trl_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int32()),
            ("input_ids", pa.list_(pa.int32())),
            ("assistant_masks", pa.list_(pa.int8())),
            ("labels", pa.list_(pa.int32())),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("flags", pa.list_(pa.string())),
            ("unfinished", pa.bool_()),
            ("over_length", pa.bool_()),
        ]
    )


def trl_table(
    ids: pa.Array,
    samples: pa.Array,
    joined: JoinedTokens,
    metadata: Sequence[dict[str, Any]],
) -> pa.Table:
    """TRL SFTTrainer rows: `input_ids`, `assistant_masks` (1 = loss) and `labels` (IGNORE_INDEX outside)."""
    schema = trl_schema()
    columns = {
        "id": ids,
        "sample": samples,
        "input_ids": _list_array(joined.ids, joined.offsets, pa.int32()),
        "assistant_masks": _list_array(joined.loss_mask.view(np.int8), joined.offsets, pa.int8()),
        "labels": _list_array(labels_for(joined), joined.offsets, pa.int32()),
    }
    for name in ("finish_reason", "prompt_tokens", "completion_tokens", "flags", "unfinished", "over_length"):
        columns[name] = pa.array([m[name] for m in metadata], type=schema.field(name).type)
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def text_row(
    prompt_id: str,
    sample: int,
    ids: np.ndarray,
    prompt_length: int,
    metadata: dict[str, Any],
    *,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    last_turn_only: bool,
) -> bytes:
    """Decoded text for template-based trainers. LOSSY: decode-then-encode is not always the identity,
    so `roundtrip_ok` says whether the trainer's re-tokenization gets these exact ids back.

    `last_turn_only` splits the row into `prompt` and `completion` (TRL's prompt-completion format): a
    trainer that finds assistant turns in one `text` would also supervise earlier assistant turns the
    prompt carries (not generated by this model, and with reasoning stripped by templates like Qwen3's).
    """
    all_ids = ids.tolist()
    row: dict[str, Any] = {"id": prompt_id, "sample": sample}
    if last_turn_only:
        prompt_ids = all_ids[:prompt_length]
        prompt, completion = decode(prompt_ids), decode(all_ids[prompt_length:])
        roundtrip_ok = encode(prompt) == prompt_ids and encode(prompt + completion) == all_ids
        row |= {"prompt": prompt, "completion": completion}
    else:
        text = decode(all_ids)
        roundtrip_ok = encode(text) == all_ids
        row["text"] = text
    row |= {"roundtrip_ok": roundtrip_ok, "metadata": metadata}
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
