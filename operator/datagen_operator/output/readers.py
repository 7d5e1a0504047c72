"""Public readers of an output directory, safe while workers write (a line still being written is skipped)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.api.progress import ShardProgress
from datagen_operator.output.layout import RECORD_FIELDS, Key, OutputLayout, record_key, shard_indices
from datagen_operator.output.segments import complete_lines, segment_records

if TYPE_CHECKING:  # imported where used: the worker starts without numpy's or pyarrow's import time
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa

    from datagen_operator.prompts.conversation import AnswerSplit

# --- readers --------------------------------------------------------------------------------


def iter_shard_records(output_dir: str | Path, shard_index: int) -> Iterator[dict[str, Any]]:
    for part in RecordBatches(output_dir, RECORD_FIELDS, rows=1024).shard_parts(shard_index):
        if isinstance(part, dict):
            yield part
            continue
        for record in part.to_pylist():
            record["finish_reason"] = orjson.loads(record["finish_reason"]) if record["finish_reason"] else None
            yield record


def iter_records(output_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Every record of a run exactly once: compacted Parquet where present, otherwise segments.

    Safe while workers are writing (a line still being written is skipped). Records are dicts with
    RECORD_FIELDS; `finish_reason` is SGLang's dict in both sources.
    """
    layout = OutputLayout(Path(output_dir))
    for index in shard_indices(layout):
        yield from iter_shard_records(output_dir, index)


class RecordBatches:
    """The records `iter_records` yields, in its order and exactly once, as Arrow record batches of `columns`
    (the store's Parquet schema; `id`, `sample` and `turn` always included) of at most `rows` rows: no Python
    object per record, for readers of millions of records (`datagen verify`). Iterate once; `duplicates`
    then holds the Parquet rows skipped as repeats of an earlier (id, sample, turn)."""

    def __init__(self, output_dir: str | Path, columns: Iterable[str], rows: int = 8192) -> None:
        self.layout = OutputLayout(Path(output_dir))
        self.names = list(dict.fromkeys(["id", "sample", "turn", *columns]))
        self.rows = rows
        self.duplicates = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        from datagen_operator.output.parquet import ColumnBatch

        for index in shard_indices(self.layout):
            pending = ColumnBatch()  # segment records, gathered into a batch
            for part in self.shard_parts(index):
                if isinstance(part, dict):
                    pending.add(part)
                    if pending.rows < self.rows:
                        continue
                    part = None
                if pending.rows:  # they go out in order, before what follows them
                    yield from pending.table().select(self.names).to_batches()
                    pending = ColumnBatch()
                if part is not None:
                    yield part
            if pending.rows:
                yield from pending.table().select(self.names).to_batches()

    def shard_parts(self, index: int) -> Iterator[pa.RecordBatch | dict[str, Any]]:
        """One shard's records exactly once, in order: Arrow batches from its Parquet (repeats dropped), then
        the records of its segments not in the Parquet, as dicts (a line still being written skipped)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        layout, names, rows = self.layout, self.names, self.rows
        parquets = sorted(layout.data_dir.glob(f"shard-{index:05d}-of-*.parquet"))
        first = first_occurrences(parquets)
        self.duplicates += int(len(first) - first.sum())
        at = 0
        for path in parquets:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=names):
                keep = first[at : at + batch.num_rows]
                at += batch.num_rows
                yield batch if keep.all() else batch.filter(pa.array(keep))
        segments = layout.segments(index)
        # Keys by their 64-bit hash: a million records hold 64 MB here, not the keys' strings and tuples.
        seen: set[int] = set()
        parquet_keys: set[int] | None = None
        for segment in segments:
            for record in segment_records(segment):
                key = hash(record_key(record))
                if parquets and parquet_keys is None:  # segments beside the Parquet: a compaction in progress
                    parquet_keys = {hash(k) for k in _keys(parquets)}
                if key in seen or (parquet_keys is not None and key in parquet_keys):
                    continue
                seen.add(key)
                yield record
        if not parquets and any(not segment.exists() for segment in segments):
            # A compaction finished while we read: what vanished with the segments is in the Parquet now.
            for path in sorted(layout.data_dir.glob(f"shard-{index:05d}-of-*.parquet")):
                for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=names):
                    keys = _batch_keys(batch)
                    unseen = [hash(key) not in seen for key in keys]
                    yield batch if all(unseen) else batch.filter(pa.array(unseen))


def _batch_keys(batch: pa.RecordBatch) -> Iterator[Key]:
    """The keys of a batch holding the id, sample and turn columns."""
    turns = batch.column("turn").fill_null(0).to_pylist()
    return zip(batch.column("id").to_pylist(), batch.column("sample").to_pylist(), turns, strict=True)


def _keys(parquets: list[Path]) -> Iterator[Key]:
    for batch in _key_batches(parquets):
        yield from _batch_keys(batch)


def first_occurrences(parquets: list[Path]) -> npt.NDArray[np.bool_]:
    """Bools over the rows of `parquets` (in order): True for the first row of each (id, sample, turn).

    Keys are grouped by a 64-bit hash computed with numpy over the id column's bytes (no Python object per
    row, the columns streamed: 8 bytes a row are kept); only rows whose hash repeats are compared as
    (id, sample, turn) values, so a collision costs time, never a record."""
    import numpy as np

    hashes = np.concatenate(
        [np.zeros(0, np.uint64)]
        + [
            _key_hashes(
                batch.column(0),
                batch.column(1).to_numpy(zero_copy_only=False),
                batch.column(2).fill_null(0).to_numpy(zero_copy_only=False),
            )
            for batch in _key_batches(parquets)
        ]
    )
    keep = np.ones(len(hashes), bool)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
    if len(repeats):
        suspects = np.unique(np.concatenate([order[repeats], order[repeats + 1]]))  # ascending rows
        seen: set[Key] = set()
        for row, key in zip(suspects.tolist(), _keys_at(parquets, suspects), strict=True):
            keep[row] = key not in seen
            seen.add(key)
    return keep


def _key_batches(parquets: list[Path]) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    for path in parquets:  # streamed: pq.read_table of the two columns holds ~7x their size while decoding
        yield from pq.ParquetFile(path).iter_batches(columns=["id", "sample", "turn"], batch_size=65_536)


def _keys_at(parquets: list[Path], rows: npt.NDArray[np.intp]) -> Iterator[Key]:
    """(id, sample, turn) of the given ascending rows."""
    at = 0
    for batch in _key_batches(parquets):
        inside = rows[(rows >= at) & (rows < at + batch.num_rows)] - at
        if len(inside):
            taken = batch.take(inside)
            yield from _batch_keys(taken)
        at += batch.num_rows


_HASH_BASE = 0x100000001B3  # FNV's 64-bit prime: odd, so powers of it never vanish mod 2**64
_TURN_MULTIPLIER = 0x9E3779B97F4A7C15  # odd (the golden ratio's 64 bits): turns spread apart from samples


def _key_hashes(
    ids: pa.StringArray, samples: npt.NDArray[np.integer[Any]], turns: npt.NDArray[np.integer[Any]]
) -> npt.NDArray[np.uint64]:
    """A 64-bit polynomial hash of each (id, sample, turn), from the string column's offsets and bytes."""
    import numpy as np

    offsets = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset : ids.offset + len(ids) + 1].astype(np.int64)
    lengths = np.diff(offsets)
    data = np.frombuffer(ids.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].astype(np.uint64)
    starts = offsets[:-1] - offsets[0]
    position = np.arange(len(data)) - np.repeat(starts, lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=0)) + 1, _HASH_BASE, np.uint64))
    terms = data * powers[position]
    sums = np.add.reduceat(terms, np.minimum(starts, max(len(terms) - 1, 0))) if len(terms) else np.zeros(0, np.uint64)
    sums = np.where(lengths > 0, sums if len(terms) else 0, 0).astype(np.uint64)
    hashes: npt.NDArray[np.uint64] = (
        sums
        ^ (lengths.astype(np.uint64) << np.uint64(40))
        ^ (samples.astype(np.uint64) * np.uint64(_HASH_BASE))
        ^ (turns.astype(np.uint64) * np.uint64(_TURN_MULTIPLIER))
    )
    return hashes


def iter_rejects(output_dir: str | Path) -> Iterator[dict[str, Any]]:
    layout = OutputLayout(Path(output_dir))
    for index in shard_indices(layout):
        path = layout.rejects(index)
        if not path.exists():
            continue
        for _, line in complete_lines(path.read_bytes()):
            with contextlib.suppress(orjson.JSONDecodeError):
                yield orjson.loads(line)


def read_progress(output_dir: str | Path) -> list[ShardProgress]:
    """The latest progress.json of each shard, as ShardProgress, ordered by shard index."""
    layout = OutputLayout(Path(output_dir))
    out = []
    for index in shard_indices(layout):
        path = layout.progress(index)
        try:
            out.append(ShardProgress.from_storage(path.read_bytes()))
        except (FileNotFoundError, orjson.JSONDecodeError, TypeError):
            continue
    return out


def stored_answers(
    output_dir: str | Path, shard_index: int, conversations: set[tuple[str, int]]
) -> dict[tuple[str, int], dict[int, AnswerSplit]]:
    """(id, sample) -> turn -> the recorded answer split, for the conversations asked for (a resumed worker's
    conversations left mid-way): only the key and answer columns are read."""
    from datagen_operator.output.records import stored_split

    found: dict[tuple[str, int], dict[int, AnswerSplit]] = {}
    batches = RecordBatches(output_dir, ("answer_content", "answer_reasoning", "answer_tool_calls"), rows=4096)
    for part in batches.shard_parts(shard_index):
        rows = [part] if isinstance(part, dict) else part.to_pylist()
        for row in rows:
            conversation = (row["id"], row["sample"])
            if conversation in conversations and row.get("answer_content") is not None:
                answers = found.setdefault(conversation, {})
                answers[row.get("turn") or 0] = stored_split(row)
    return found
