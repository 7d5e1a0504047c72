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

from datagen_operator.api.flags import effective_flags, ends_truncated, stored_finish_type

IGNORE_INDEX = -100  # what HF/TRL losses skip in `labels`
OVER_LENGTH_POLICIES = ("drop", "keep-flagged")


# --- which rows go out ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    exclude_flags: frozenset[str] = frozenset()
    max_length: int | None = None
    over_length: str = "drop"  # OVER_LENGTH_POLICIES; never "cut": cutting the end removes the stop token


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


def finish_types(column: pa.Array) -> list[str | None]:
    """`stored_finish_type` of each row, parsed once per distinct value (a batch repeats a handful)."""
    parsed: dict[str | None, str | None] = {}
    out = []
    for value in column.to_pylist():
        if value not in parsed:
            parsed[value] = stored_finish_type(value)
        out.append(parsed[value])
    return out


def exclusions(
    flags: pa.Array, finishes: Sequence[str | None], lengths: np.ndarray, selection: Selection
) -> dict[int, str]:
    """Row -> `exclusion_reason` for the rows of a batch left out. Only a row with a stored flag, a `length`
    finish or over --max-length can be; the rest of the batch is not looked at row by row."""
    if not selection.exclude_flags and selection.max_length is None:
        return {}
    suspects = list_lengths(flags) > 0
    suspects |= np.fromiter((ends_truncated(finish) for finish in finishes), dtype=bool, count=len(finishes))
    if selection.max_length is not None:
        suspects |= lengths > selection.max_length
    rows = np.flatnonzero(suspects).tolist()
    if not rows:
        return {}
    flag_lists = flags.to_pylist()
    out = {}
    for row in rows:
        reason = exclusion_reason(effective_flags(flag_lists[row] or (), finishes[row]), int(lengths[row]), selection)
        if reason is not None:
            out[row] = reason
    return out


# --- tokens on whole columns ------------------------------------------------------------------------


def list_lengths(column: pa.Array) -> np.ndarray:
    lengths: np.ndarray = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)
    return lengths


@dataclass(frozen=True)
class TokenColumns:
    """A batch's prompts and completions as Arrow's own buffers (zero-copy): values plus row offsets."""

    prompt_values: np.ndarray  # int32
    prompt_offsets: np.ndarray  # rows + 1, into prompt_values (a sliced batch need not start at 0)
    completion_values: np.ndarray
    completion_offsets: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.prompt_offsets) - 1

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    @property
    def completion_lengths(self) -> np.ndarray:
        return np.diff(self.completion_offsets)

    def prompt(self, row: int) -> np.ndarray:
        return self.prompt_values[self.prompt_offsets[row] : self.prompt_offsets[row + 1]]

    def completion(self, row: int) -> np.ndarray:
        return self.completion_values[self.completion_offsets[row] : self.completion_offsets[row + 1]]

    def supervised_values(self) -> np.ndarray:
        """Every completion token of the batch (what the loss covers), contiguous."""
        return self.completion_values[self.completion_offsets[0] : self.completion_offsets[-1]]


def id_buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list<int32> column as its values (int32) and row offsets (rows + 1, into the values): zero-copy."""
    return _buffers(column)


def _buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    if column.null_count:
        column = pc.fill_null(column, pa.scalar([], column.type))
    values = column.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return values, column.offsets.to_numpy().astype(np.int64)


def token_columns(input_ids: pa.Array, output_ids: pa.Array) -> TokenColumns:
    return TokenColumns(*_buffers(input_ids), *_buffers(output_ids))


def joined_ids(tokens: TokenColumns) -> tuple[np.ndarray, np.ndarray]:
    """Each row's prompt then completion, back to back, and the row offsets: one concatenate of slices
    (memcpy per run; a boolean-mask scatter is several times slower)."""
    pieces: list[np.ndarray] = []
    for row in range(tokens.rows):
        pieces += (tokens.prompt(row), tokens.completion(row))
    offsets = np.zeros(tokens.rows + 1, dtype=np.int64)
    np.cumsum(tokens.prompt_lengths + tokens.completion_lengths, out=offsets[1:])
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return ids.astype(np.int32, copy=False), offsets


def loss_mask_values(tokens: TokenColumns) -> np.ndarray:
    """uint8, 0 over each prompt and 1 over each completion (its stop token included), back to back."""
    runs = np.empty(2 * tokens.rows, dtype=np.int64)
    runs[0::2], runs[1::2] = tokens.prompt_lengths, tokens.completion_lengths
    return np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), tokens.rows), runs)


def labels_values(ids: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """HF `labels`: the id where the loss applies, IGNORE_INDEX elsewhere (unshifted, as `input_ids`)."""
    return np.where(loss_mask.view(np.bool_), ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)


def completion_counts(tokens: TokenColumns) -> np.ndarray:
    """Occurrences of each id among the supervised (completion) tokens: the drafter's vocabulary counts."""
    # numpy casts int32 to intp inside bincount more slowly than astype does (20-45 % of the call, numpy 2.4).
    return np.bincount(tokens.supervised_values().astype(np.intp))


# --- per-format rows --------------------------------------------------------------------------------


METADATA_FIELDS = (
    "finish_reason", "prompt_tokens", "completion_tokens", "flags", "unfinished", "over_length",
    "spans_supervised", "spans_rerendered",
)  # fmt: skip


def row_metadata(
    finish: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    flags: Sequence[str],
    *,
    unfinished: bool,
    over_length: bool,
    spans_supervised: int = 1,
    spans_rerendered: int = 0,
) -> dict[str, Any]:
    """Flat and schema-stable: every key in every row (per-turn and whole-conversation rows alike), so
    column-inferring loaders see one schema. A conversation row's finish and token counts are its last turn's."""
    return {
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "flags": list(flags),
        "unfinished": unfinished,  # read from a segment of a shard that was not compacted yet
        "over_length": over_length,  # longer than --max-length, kept whole (--over-length keep-flagged)
        "spans_supervised": spans_supervised,  # answers under the loss: 1 in a per-turn row
        "spans_rerendered": spans_rerendered,  # earlier answers held re-rendered, mask 0: 0 in a per-turn row
    }


def _json_concat(left: bytes, right: bytes) -> bytes:
    """Two JSON arrays as one, spliced as bytes."""
    if left == b"[]":
        return right
    if right == b"[]":
        return left
    return left[:-1] + b"," + right[1:]


def loss_mask_json(prompt_length: int, completion_length: int) -> bytes:
    body = b"0," * prompt_length + b"1," * completion_length
    return b"[" + body[:-1] + b"]"


def speculators_row(
    prompt_id: str,
    sample: int,
    prompt_ids: np.ndarray,
    completion_ids: np.ndarray,
    metadata: dict[str, Any],
    *,
    turn: int = 0,
    fields: str | None = None,
) -> bytes:
    """One JSONL line for vLLM speculators (>= 0.7.0 pre-tokenized rows) and SpecForge main:
    `{"id", "sample", "turn", "input_ids": prompt + completion, "loss_mask", "metadata", "source_fields"}`
    (`fields`: the record's source_fields, JSON text of the dataset line's other fields, spliced as they are).

    Built from byte pieces (orjson serialises each id array in C) so no per-token Python runs."""
    as_json = orjson.OPT_SERIALIZE_NUMPY
    ids = _json_concat(orjson.dumps(prompt_ids, option=as_json), orjson.dumps(completion_ids, option=as_json))
    mask = loss_mask_json(len(prompt_ids), len(completion_ids))
    return _speculators_line(prompt_id, sample, turn, ids, mask, metadata, fields)


def speculators_masked_row(
    prompt_id: str,
    sample: int,
    turn: int,
    ids: np.ndarray,
    mask: np.ndarray,
    metadata: dict[str, Any],
    fields: str | None = None,
) -> bytes:
    """The same line for a row with any mask (a whole conversation's: several supervised spans)."""
    as_json = orjson.OPT_SERIALIZE_NUMPY
    ids_json, mask_json = orjson.dumps(ids, option=as_json), orjson.dumps(mask, option=as_json)
    return _speculators_line(prompt_id, sample, turn, ids_json, mask_json, metadata, fields)


def _speculators_line(
    prompt_id: str,
    sample: int,
    turn: int,
    ids_json: bytes,
    mask_json: bytes,
    metadata: dict[str, Any],
    fields: str | None,
) -> bytes:
    head = orjson.dumps({"id": prompt_id, "sample": sample, "turn": turn})[:-1]
    return b"".join(
        (head, b',"input_ids":', ids_json, b',"loss_mask":', mask_json, b',"metadata":', orjson.dumps(metadata),
         b',"source_fields":', fields_json(fields), b"}\n")
    )  # fmt: skip


def fields_json(fields: str | None) -> bytes:
    """A record's source_fields as the JSON value of a row: the stored object's text, `null` where it has none."""
    return fields.encode() if fields else b"null"


def _list_array(values: np.ndarray, offsets: np.ndarray, value_type: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type=value_type))


def trl_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int32()),
            ("turn", pa.int32()),
            ("input_ids", pa.list_(pa.int32())),
            ("assistant_masks", pa.list_(pa.int8())),
            ("labels", pa.list_(pa.int32())),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("flags", pa.list_(pa.string())),
            ("unfinished", pa.bool_()),
            ("over_length", pa.bool_()),
            ("spans_supervised", pa.int32()),
            ("spans_rerendered", pa.int32()),
            ("source_fields", pa.string()),  # JSON text: each line's own fields, whatever their shape
        ]
    )


def trl_table(
    ids: pa.Array,
    samples: pa.Array,
    turns: pa.Array,
    tokens: TokenColumns,
    metadata: Sequence[dict[str, Any]],
    fields: pa.Array | None = None,
) -> pa.Table:
    """TRL SFTTrainer rows: `input_ids`, `assistant_masks` (1 = loss) and `labels` (IGNORE_INDEX outside)."""
    input_ids, offsets = joined_ids(tokens)
    return trl_masked_table(ids, samples, turns, input_ids, offsets, loss_mask_values(tokens), metadata, fields)


def trl_masked_table(
    ids: pa.Array,
    samples: pa.Array,
    turns: pa.Array,
    input_ids: np.ndarray,
    offsets: np.ndarray,
    loss_mask: np.ndarray,
    metadata: Sequence[dict[str, Any]],
    fields: pa.Array | None = None,
) -> pa.Table:
    """The same rows from ids and masks back to back (uint8 mask; `offsets`: rows + 1 into both). `fields`: the
    records' source_fields (a string column, JSON text), null for every row when None."""
    schema = trl_schema()
    columns = {
        "id": ids,
        "sample": samples,
        "turn": turns,
        "input_ids": _list_array(input_ids, offsets, pa.int32()),
        "assistant_masks": _list_array(loss_mask.view(np.int8), offsets, pa.int8()),
        "labels": _list_array(labels_values(input_ids, loss_mask), offsets, pa.int32()),
    }
    for name in METADATA_FIELDS:
        columns[name] = pa.array([m[name] for m in metadata], type=schema.field(name).type)
    columns["source_fields"] = fields if fields is not None else pa.nulls(len(metadata), pa.string())
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def text_row(
    prompt_id: str,
    sample: int,
    prompt_ids: np.ndarray,
    completion_ids: np.ndarray,
    metadata: dict[str, Any],
    *,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    last_turn_only: bool,
    turn: int = 0,
    fields: str | None = None,
) -> bytes:
    """Decoded text for template-based trainers. LOSSY: decode-then-encode is not always the identity,
    so `roundtrip_ok` says whether the trainer's re-tokenization gets these exact ids back.

    `last_turn_only` splits the row into `prompt` and `completion` (TRL's prompt-completion format): a
    trainer that finds assistant turns in one `text` would also supervise earlier assistant turns the
    prompt carries (not generated by this model, and with reasoning stripped by templates like Qwen3's).
    """
    prompt_list, completion_list = prompt_ids.tolist(), completion_ids.tolist()
    all_ids = prompt_list + completion_list
    row: dict[str, Any] = {"id": prompt_id, "sample": sample, "turn": turn}
    if last_turn_only:
        prompt, completion = decode(prompt_list), decode(completion_list)
        roundtrip_ok = encode(prompt) == prompt_list and encode(prompt + completion) == all_ids
        row |= {"prompt": prompt, "completion": completion}
    else:
        text = decode(all_ids)
        roundtrip_ok = encode(text) == all_ids
        row["text"] = text
    row |= {"roundtrip_ok": roundtrip_ok, "metadata": metadata}
    return orjson.dumps(row)[:-1] + b',"source_fields":' + fields_json(fields) + b"}\n"
