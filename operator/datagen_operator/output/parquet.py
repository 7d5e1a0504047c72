"""Compaction: a shard's segments into one Parquet file in dataset order, and reading it back."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.api.progress import Counts
from datagen_operator.output.layout import (
    RECORD_FIELDS,
    Key,
    KeySet,
    OutputLayout,
    fsync_dir,
    keys_path,
    record_key,
    sha256_file,
)
from datagen_operator.output.segments import parse_record_line, recover_segment

if TYPE_CHECKING:  # imported where used: the worker starts without numpy's or pyarrow's import time
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

# --- Parquet ---------------------------------------------------------------------------------------


def parquet_schema() -> pa.Schema:
    import pyarrow as pa

    tokens = pa.list_(pa.int32())
    return pa.schema(
        [
            ("id", pa.string()),
            ("sample", pa.int32()),
            ("input_ids", tokens),
            ("output_ids", tokens),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("cached_tokens", pa.int32()),
            ("latency_s", pa.float64()),
            ("done_at", pa.float64()),
            ("server", pa.string()),
            ("attempts", pa.int32()),
            ("has_tools", pa.bool_()),
            ("flags", pa.list_(pa.string())),
            ("line", pa.int64()),
            ("prompt_hash", pa.uint64()),
            ("run", pa.string()),
            ("turn", pa.int32()),
            ("thinking", pa.bool_()),
            ("answer_content", pa.string()),
            ("answer_reasoning", pa.string()),
            # The answer's tool calls as SGLang's parser returns them (absent from outputs written before it).
            ("answer_tool_calls", pa.list_(pa.struct([("name", pa.string()), ("arguments", pa.string())]))),
            ("num_retractions", pa.int32()),
            # The dataset line's other fields as JSON text (free-form: one string column whatever each line holds;
            # absent from outputs written before it, read as none).
            ("source_fields", pa.string()),
        ]
    )


def parquet_keys_and_summary(path: Path, keys: KeySet) -> Counts:
    """Exact counts of a compacted shard (token counts are list lengths, as in Counts.add_record); its
    keys are added to `keys`."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    summary = Counts()
    columns = ["id", "sample", "input_ids", "output_ids", "cached_tokens", "flags", "has_tools", "turn"]
    for batch in pq.ParquetFile(path).iter_batches(columns=columns, batch_size=8192):
        ids, samples = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        keys.update(zip(ids, samples, batch.column(7).fill_null(0).to_pylist(), strict=True))
        summary.records += len(ids)
        summary.prompt_tokens += int(pc.sum(pc.list_value_length(batch.column(2))).as_py() or 0)
        summary.output_tokens += int(pc.sum(pc.list_value_length(batch.column(3))).as_py() or 0)
        summary.cached_tokens += int(pc.sum(batch.column(4)).as_py() or 0)
        summary.tool_records += int(pc.sum(batch.column(6)).as_py() or 0)
        for flags in batch.column(5).to_pylist():
            if flags:
                summary.flags.update(flags)
    return summary


class ColumnBatch:
    """Columns for one Parquet row group, built without per-token Python work (array.array extends in C)."""

    def __init__(self) -> None:
        self.rows = 0
        self.tokens = 0
        self.scalars: dict[str, list[Any]] = {
            name: [] for name in RECORD_FIELDS if name not in ("input_ids", "output_ids")
        }
        self.values: dict[str, array[int]] = {"input_ids": array("i"), "output_ids": array("i")}
        self.offsets: dict[str, array[int]] = {"input_ids": array("i", [0]), "output_ids": array("i", [0])}

    def add(self, record: dict[str, Any]) -> None:
        for name in ("input_ids", "output_ids"):
            values = self.values[name]
            values.extend(record[name])
            self.offsets[name].append(len(values))
        self.tokens += len(record["input_ids"]) + len(record["output_ids"])
        scalars = self.scalars
        for name, column in scalars.items():
            value = record.get(name)
            if name == "finish_reason":
                value = orjson.dumps(value).decode() if value is not None else None
            column.append(value)
        self.rows += 1

    def table(self) -> pa.Table:
        import pyarrow as pa

        schema = parquet_schema()
        arrays = []
        for item in schema:
            if item.name in self.values:
                flat = self.values[item.name]
                values = pa.Array.from_buffers(pa.int32(), len(flat), [None, pa.py_buffer(flat)])
                offsets = pa.Array.from_buffers(
                    pa.int32(), len(self.offsets[item.name]), [None, pa.py_buffer(self.offsets[item.name])]
                )
                arrays.append(pa.ListArray.from_arrays(offsets, values, type=item.type))
            else:
                arrays.append(pa.array(self.scalars[item.name], type=item.type))
        return pa.Table.from_arrays(arrays, schema=schema)


PARQUET_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 9,
    # Token ids are high-cardinality; dictionary pages only bloat them. Ids and short strings still use it.
    "use_dictionary": ["id", "finish_reason", "server", "flags.list.element"],
    "write_statistics": ["id", "sample"],
}
ROW_GROUP_TOKENS = 32 * 1024 * 1024
"""A row group ends at this many token ids (int32: 128 MiB of id columns) ..."""
ROW_GROUP_ROWS = 65_536
"""... or at this many rows: short records would otherwise make groups of millions of rows, whose per-row
Python values (ids, flags, finish reasons) cost far more memory than their tokens (bench/scale.py)."""


@dataclass
class CompactionResult:
    path: Path
    rows: int
    tokens: int
    bytes: int
    sha256: str
    orphans: int


class _Sources:
    """Where each record of a shard's segments is: (key hash, segment, offset, length) in sorted numpy arrays,
    the first copy of a key winning. 24 bytes a record instead of Python tuples (bench/scale.py); a record
    read back is checked against the key asked for, so a hash collision cannot return the wrong one."""

    def __init__(self, layout: OutputLayout, shard_index: int) -> None:
        import numpy as np

        self.paths = layout.segments(shard_index)
        hashes, segments, offsets, lengths = array("q"), array("i"), array("q"), array("q")
        for index, segment in enumerate(self.paths):
            for prompt_id, sample, turn, offset, length in recover_segment(segment).entries:
                hashes.append(hash((prompt_id, sample, turn)))
                segments.append(index)
                offsets.append(offset)
                lengths.append(length)
        all_hashes = np.frombuffer(hashes, dtype=np.int64) if hashes else np.zeros(0, np.int64)
        self.hashes, first = np.unique(all_hashes, return_index=True)  # sorted; the first copy's position
        self.segments = np.frombuffer(segments, dtype=np.int32)[first] if hashes else np.zeros(0, np.int32)
        self.offsets = np.frombuffer(offsets, dtype=np.int64)[first] if hashes else np.zeros(0, np.int64)
        self.lengths = np.frombuffer(lengths, dtype=np.int64)[first] if hashes else np.zeros(0, np.int64)
        self.used = np.zeros(len(self.hashes), dtype=bool)
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.hashes)

    def find(self, key: Key) -> int:
        import numpy as np

        at = int(np.searchsorted(self.hashes, hash(key)))
        return at if at < len(self.hashes) and self.hashes[at] == hash(key) else -1

    def read(self, at: int) -> dict[str, Any] | None:
        segment = int(self.segments[at])
        fd = self._fds.get(segment)
        if fd is None:
            fd = self._fds[segment] = os.open(self.paths[segment], os.O_RDONLY)
        return parse_record_line(os.pread(fd, int(self.lengths[at]), int(self.offsets[at])))

    def unused(self) -> npt.NDArray[np.intp]:
        """Positions of the records not written yet, in segment order."""
        import numpy as np

        left = np.flatnonzero(~self.used)
        return left[np.lexsort((self.offsets[left], self.segments[left]))]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def compact_shard(
    layout: OutputLayout,
    shard_index: int,
    shard_count: int,
    order: Iterable[Key],
    *,
    remove_segments: bool = True,
) -> CompactionResult:
    """Write the shard's records as one Parquet file in `order` (dataset order x sample), atomically.

    Reads each record from its segment by offset, so memory stays at one row group. Records present but
    absent from `order` (the dataset lost a prompt since) are kept, appended at the end, and counted.
    A previous compaction's Parquet is merged in, so re-running a grown dataset loses nothing.
    """
    import pyarrow.parquet as pq

    final = layout.parquet(shard_index, shard_count)
    final.parent.mkdir(parents=True, exist_ok=True)
    sources = _Sources(layout, shard_index)
    if not len(sources) and final.exists():  # already compacted, nothing new since
        rows = pq.ParquetFile(final).metadata.num_rows
        return CompactionResult(final, rows, -1, final.stat().st_size, sha256_file(final), 0)
    previous: dict[Key, dict[str, Any]] = {}
    if final.exists():
        for row in pq.read_table(final).to_pylist():
            row["finish_reason"] = orjson.loads(row["finish_reason"]) if row["finish_reason"] else None
            previous[record_key(row)] = row

    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        rows, tokens, orphans = _write_parquet(tmp, order, previous, sources)
        with tmp.open("rb") as file:
            os.fsync(file.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full volume keeps no half Parquet; the segments are untouched
        raise
    fsync_dir(final.parent)
    if remove_segments:
        for segment in layout.segments(shard_index):
            keys_path(segment).unlink(missing_ok=True)
            segment.unlink()
        fsync_dir(layout.shard_dir(shard_index))
    return CompactionResult(final, rows, tokens, final.stat().st_size, sha256_file(final), orphans)


def _write_parquet(
    tmp: Path, order: Iterable[Key], previous: dict[Key, dict[str, Any]], sources: _Sources
) -> tuple[int, int, int]:
    import pyarrow.parquet as pq

    written: set[Key] = set()
    """Keys written from `previous` (a re-compaction); segment records are marked in `sources.used`."""
    rows = tokens = orphans = 0
    writer = pq.ParquetWriter(tmp, parquet_schema(), **PARQUET_WRITE_OPTIONS)
    try:
        batch = ColumnBatch()

        def emit(record: dict[str, Any]) -> None:
            nonlocal batch, rows, tokens
            batch.add(record)
            rows += 1
            tokens += len(record["input_ids"]) + len(record["output_ids"])
            if batch.tokens >= ROW_GROUP_TOKENS or batch.rows >= ROW_GROUP_ROWS:
                writer.write_table(batch.table())
                batch = ColumnBatch()

        def from_segments(key: Key) -> dict[str, Any] | None:
            at = sources.find(key)
            if at < 0 or sources.used[at]:
                return None
            record = sources.read(at)
            if record is None or record_key(record) != key:
                return None  # a hash collision: the orphan pass below writes that record
            sources.used[at] = True
            return record

        def emit_previous(key: Key) -> None:
            written.add(key)
            emit(previous[key])
            at = sources.find(key)  # a newer copy in the segments is not an orphan
            if at >= 0:
                sources.used[at] = True

        for key in order:
            if key in written:
                continue
            if key in previous:
                emit_previous(key)
                continue
            record = from_segments(key)
            if record is not None:
                emit(record)
        for key in previous:
            if key not in written:
                emit_previous(key)
                orphans += 1
        for at in sources.unused():
            record = sources.read(int(at))
            if record is None or record_key(record) in written:
                continue
            sources.used[at] = True
            emit(record)
            orphans += 1
        if batch.rows:
            writer.write_table(batch.table())
    finally:
        writer.close()
        sources.close()
    return rows, tokens, orphans
