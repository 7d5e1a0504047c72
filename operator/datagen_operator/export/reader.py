"""Stream a run's records shard by shard as Arrow record batches, with memory bounded by one batch.

Compacted shards are read from Parquet column chunks (never whole files); shards of an unfinished run
are read from their JSONL segments line by line and marked `unfinished`. Keys are deduplicated exactly
as `store.iter_shard_records` does (Parquet first, then segment records not already seen), so each
record is exported once even after a crash between compaction and segment removal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from datagen_operator.worker.store import OutputLayout, parse_record_line

COLUMNS = ("id", "sample", "input_ids", "output_ids", "finish_reason", "prompt_tokens", "completion_tokens", "flags")
BATCH_ROWS = 512
# Small read buffer: a row group can hold 32M tokens; reading it whole would break the memory bound.
PARQUET_BUFFER_BYTES = 4 * 1024 * 1024


def source_schema() -> pa.Schema:
    tokens = pa.list_(pa.int32())
    return pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int32()),
            ("input_ids", tokens),
            ("output_ids", tokens),
            ("finish_reason", pa.string()),  # SGLang's dict as JSON, as the Parquet stores it
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("flags", pa.list_(pa.string())),
        ]
    )


@dataclass(frozen=True)
class SourceBatch:
    records: pa.RecordBatch  # COLUMNS, typed as source_schema()
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


def _parquet_batches(path: Path, batch_rows: int) -> Iterator[pa.RecordBatch]:
    file = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
    # Columns are used by name; list field names ("element" vs "item") may differ from source_schema().
    yield from file.iter_batches(batch_size=batch_rows, columns=list(COLUMNS))


def _parquet_keys(paths: list[Path]) -> set[tuple[str, int]]:
    keys: set[tuple[str, int]] = set()
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["id", "sample"], batch_size=65536):
            keys.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True))
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


def records_to_batch(records: list[dict[str, Any]]) -> pa.RecordBatch:
    """Segment records (dicts) as a batch of the Parquet's columns; finish_reason re-encoded as JSON."""
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for record in records:
        for name in COLUMNS:
            value = record.get(name)
            if name == "finish_reason" and value is not None:
                value = orjson.dumps(value).decode()
            elif name == "flags":
                value = value or []
            columns[name].append(value)
    schema = source_schema()
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def _segment_batches(segments: list[Path], seen: set[tuple[str, int]], batch_rows: int) -> Iterator[pa.RecordBatch]:
    pending: list[dict[str, Any]] = []
    for segment in segments:
        for line in _segment_lines(segment):
            record = parse_record_line(line)
            if record is None:
                continue
            key = (record["id"], record["sample"])
            if key in seen:
                continue
            seen.add(key)
            pending.append(record)
            if len(pending) >= batch_rows:
                yield records_to_batch(pending)
                pending = []
    if pending:
        yield records_to_batch(pending)


def iter_source_batches(output_dir: str | Path, batch_rows: int = BATCH_ROWS) -> Iterator[SourceBatch]:
    """Every record of the run exactly once, shard by shard, in batches of at most `batch_rows`."""
    layout = OutputLayout(Path(output_dir))
    for shard in shard_indices(layout):
        parquets = shard_parquets(layout, shard)
        for path in parquets:
            for batch in _parquet_batches(path, batch_rows):
                yield SourceBatch(batch, shard, unfinished=False)
        segments = layout.segments(shard)
        if segments:
            # Keys only where both exist (a grown dataset, or a crash before segments were removed).
            seen = _parquet_keys(parquets) if parquets else set()
            for batch in _segment_batches(segments, seen, batch_rows):
                yield SourceBatch(batch, shard, unfinished=True)
