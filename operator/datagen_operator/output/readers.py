"""Public readers of an output directory, safe while workers write (a line still being written is skipped)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.progress import ShardProgress
from datagen_operator.output.layout import OutputLayout, shard_indices
from datagen_operator.output.parquet import parquet_records
from datagen_operator.output.segments import complete_lines, segment_records

# --- readers --------------------------------------------------------------------------------


def iter_shard_records(output_dir: str | Path, shard_index: int) -> Iterator[dict[str, Any]]:
    layout = OutputLayout(Path(output_dir))
    # Keys by their 64-bit hash: a million records hold 64 MB here, not the keys' strings and tuples.
    seen: set[int] = set()

    def from_parquet() -> Iterator[dict[str, Any]]:
        for parquet in sorted(layout.data_dir.glob(f"shard-{shard_index:05d}-of-*.parquet")):
            for record in parquet_records(parquet):
                key = hash((record["id"], record["sample"]))
                if key not in seen:
                    seen.add(key)
                    yield record

    had_parquet = any(layout.data_dir.glob(f"shard-{shard_index:05d}-of-*.parquet"))
    yield from from_parquet()
    segments = layout.segments(shard_index)
    for segment in segments:
        for record in segment_records(segment):
            key = hash((record["id"], record["sample"]))
            if key not in seen:
                seen.add(key)
                yield record
    if not had_parquet and any(not segment.exists() for segment in segments):
        # A compaction finished while we read: what vanished with the segments is in the Parquet now.
        yield from from_parquet()


def iter_records(output_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Every record of a run exactly once: compacted Parquet where present, otherwise segments.

    Safe while workers are writing (a line still being written is skipped). Records are dicts with
    RECORD_FIELDS; `finish_reason` is SGLang's dict in both sources.
    """
    layout = OutputLayout(Path(output_dir))
    for index in shard_indices(layout):
        yield from iter_shard_records(output_dir, index)


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
