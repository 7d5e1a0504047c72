"""Stream a run's records shard by shard as Arrow record batches, with memory bounded by one batch.

Compacted shards are read from Parquet column chunks (never whole files); shards of an unfinished run
are read from their JSONL segments line by line and marked `unfinished`. Keys are (id, sample, turn)
(`output.layout.record_key`: every turn of a regenerated conversation is its own record), deduplicated as
`output.readers.iter_shard_records` does (Parquet first, then segment records not already seen), so each
record is exported once even after a crash between compaction and segment removal.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from datagen_operator.output.layout import Key, OutputLayout, record_key
from datagen_operator.output.parquet import parquet_schema
from datagen_operator.output.segments import parse_record_line

COLUMNS = (
    "id", "sample", "turn", "input_ids", "output_ids", "finish_reason", "prompt_tokens", "completion_tokens", "flags",
    "source_fields",
)  # fmt: skip
BATCH_TOKENS = 1 << 19
"""Tokens (prompt + output) per batch, about: what bounds memory, whatever the row lengths (rows of
128k-token reasoning or of 200 tokens alike)."""
# Small read buffer: a row group can hold 32M tokens; reading it whole would break the memory bound.
PARQUET_BUFFER_BYTES = 1024 * 1024


def source_schema(columns: Sequence[str] = COLUMNS) -> pa.Schema:
    """The store's Parquet schema, cut to the columns an export reads (`COLUMNS`, in that order)."""
    stored = parquet_schema()
    return pa.schema([stored.field(name) for name in columns])


@dataclass(frozen=True)
class SourceBatch:
    records: pa.RecordBatch  # the columns asked for (COLUMNS by default), typed as source_schema()
    shard: int
    unfinished: bool  # read from the segments of a shard not yet compacted


def shard_indices(layout: OutputLayout) -> list[int]:
    indices: set[int] = set()
    if layout.shards_dir.is_dir():
        indices.update(int(p.name) for p in layout.shards_dir.iterdir() if p.name.isdigit())
    if layout.data_dir.is_dir():
        indices.update(int(p.name.split("-")[1]) for p in layout.data_dir.glob("shard-*-of-*.parquet"))
    return sorted(indices)


def shard_parquets(layout: OutputLayout, shard: int) -> list[Path]:
    return sorted(layout.data_dir.glob(f"shard-{shard:05d}-of-*.parquet"))


def rows_for_tokens(row_group: pq.RowGroupMetaData, batch_tokens: int) -> int:
    """Rows per batch so a batch holds about `batch_tokens`, from the row group's uncompressed token bytes."""
    token_bytes: int = sum(
        row_group.column(i).total_uncompressed_size
        for i in range(row_group.num_columns)
        if row_group.column(i).path_in_schema.split(".")[0] in ("input_ids", "output_ids")
    )
    tokens = max(1, token_bytes // 4)  # int32 values; the list levels add little
    return max(1, int(row_group.num_rows) * batch_tokens // tokens)


def _parquet_batches(path: Path, batch_tokens: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    file = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
    present = set(file.schema_arrow.names)
    missing = [name for name in columns if name not in present]  # a shard compacted before records had turns
    schema = source_schema(columns)
    for index in range(file.metadata.num_row_groups):
        rows = rows_for_tokens(file.metadata.row_group(index), batch_tokens)
        # Columns are used by name; list field names ("element" vs "item") may differ from source_schema().
        read = [name for name in columns if name in present]
        for batch in file.iter_batches(batch_size=rows, row_groups=[index], columns=read, use_threads=False):
            if not missing:
                yield batch
                continue
            arrays = [
                batch.column(name) if name in present else pa.nulls(batch.num_rows, schema.field(name).type)
                for name in columns
            ]
            yield pa.RecordBatch.from_arrays(arrays, names=list(columns))


def _parquet_keys(paths: list[Path]) -> set[Key]:
    keys: set[Key] = set()
    for path in paths:
        file = pq.ParquetFile(path)
        has_turn = "turn" in file.schema_arrow.names
        for batch in file.iter_batches(columns=["id", "sample", "turn"] if has_turn else ["id", "sample"]):
            turns = batch.column(2).fill_null(0).to_pylist() if has_turn else [0] * batch.num_rows
            keys.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), turns, strict=True))
    return keys


def _segment_lines(segment: Path) -> Iterator[bytes]:
    """Newline-terminated lines only: a last line still being written (or torn) is skipped."""
    try:
        file = segment.open("rb")
    except FileNotFoundError:
        return  # removed by a compaction that just finished
    with file:
        for line in file:
            if line.endswith(b"\n"):
                yield line


def records_to_batch(records: list[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> pa.RecordBatch:
    """Segment records (dicts) as a batch of the Parquet's columns; finish_reason re-encoded as JSON."""
    values: dict[str, list[Any]] = {name: [] for name in columns}
    for record in records:
        for name in columns:
            value = record.get(name)
            if name == "finish_reason" and value is not None:
                value = orjson.dumps(value).decode()
            elif name == "flags":
                value = value or []
            elif name == "turn":
                value = value or 0
            values[name].append(value)
    schema = source_schema(columns)
    return pa.RecordBatch.from_arrays([pa.array(values[f.name], type=f.type) for f in schema], schema=schema)


def _segment_batches(
    segments: list[Path], seen: set[Key], batch_tokens: int, columns: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    pending: list[dict[str, Any]] = []
    pending_tokens = 0
    for segment in segments:
        for line in _segment_lines(segment):
            record = parse_record_line(line)
            if record is None:
                continue
            key = record_key(record)
            if key in seen:
                continue
            seen.add(key)
            pending.append(record)
            pending_tokens += len(record["input_ids"]) + len(record["output_ids"])
            if pending_tokens >= batch_tokens:
                yield records_to_batch(pending, columns)
                pending, pending_tokens = [], 0
    if pending:
        yield records_to_batch(pending, columns)


def iter_source_batches(
    output_dir: str | Path, batch_tokens: int = BATCH_TOKENS, columns: Sequence[str] = COLUMNS
) -> Iterator[SourceBatch]:
    """Every record of the run exactly once, shard by shard, in batches of about `batch_tokens` tokens.
    `columns`: the store's columns to read (the token ones must be among them: batches are sized by tokens)."""
    layout = OutputLayout(Path(output_dir))
    for shard in shard_indices(layout):
        parquets = shard_parquets(layout, shard)
        for path in parquets:
            for batch in _parquet_batches(path, batch_tokens, columns):
                yield SourceBatch(batch, shard, unfinished=False)
        segments = layout.segments(shard)
        if segments:
            # Keys only where both exist (a grown dataset, or a crash before segments were removed).
            seen = _parquet_keys(parquets) if parquets else set()
            for batch in _segment_batches(segments, seen, batch_tokens, columns):
                yield SourceBatch(batch, shard, unfinished=True)


def prefetched(items: Iterable[SourceBatch], depth: int = 2) -> Iterator[SourceBatch]:
    """`items`, produced on a background thread up to `depth` ahead: Parquet decoding (which releases the
    GIL) overlaps with formatting the previous batch."""
    done = object()
    slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                slots.put(item)
            slots.put(done)
        except BaseException as error:
            slots.put(error)

    thread = threading.Thread(target=produce, name="export-reader", daemon=True)
    thread.start()
    try:
        while (item := slots.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                slots.get(timeout=0.1)
