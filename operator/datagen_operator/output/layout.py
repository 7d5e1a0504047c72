"""Where a run's output lives on its volume, and the small file operations every writer uses.

Layout (shared by all shards of a run):

    manifest.json                         fingerprint, shard count, per-shard counts and Parquet checksums
    shards/<index:05d>/segment-<seq:06d>.jsonl       records, one JSON object a line, append-only
    shards/<index:05d>/segment-<seq:06d>.keys.json   written when a segment is sealed: keys, offsets, summary
    shards/<index:05d>/rejects.jsonl       malformed dataset lines and records the server refused (400)
    shards/<index:05d>/progress.json       counters, rewritten atomically every few seconds
    data/shard-<index:05d>-of-<count:05d>.parquet    after compaction, rows in dataset order

Crash safety. Each worker start opens a NEW segment and never appends to an older one, so a torn last
line (kill -9 mid-write, or power loss before fsync) can only sit at the end of a segment that is no
longer written; recovery truncates it and seals the segment. A record counts as done only once its
whole line (ending in a newline) is in a segment, so resume is exactly-once by (id, sample, turn): what
is in the files is skipped, everything else is generated again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Key = tuple[str, int, int]
"""(prompt id, sample index, turn): the identity of a record. `turn` is which of a conversation's answers the
record holds (generation.turns: all, 0 = the answer to its first user turn); 0 for one answer per line."""


def record_key(record: Mapping[str, Any]) -> Key:
    """A stored record's key (a record without a turn is the one answer of its line)."""
    return (record["id"], record["sample"], record.get("turn") or 0)


class KeySet:
    """A set of (id, sample, turn) keys held as their 64-bit hashes (Python's, consistent within one process):
    a million recorded keys take ~64 MB, not the ~170 MB of their tuples and strings, so a resumed worker's
    memory does not grow with what it already did. Two distinct keys share a hash with probability
    ~n^2/2^65 (3e-8 for a million keys)."""

    __slots__ = ("_hashes",)

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self._hashes: set[int] = {hash(key) for key in keys}

    def __contains__(self, key: object) -> bool:
        return hash(key) in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeySet):
            return self._hashes == other._hashes
        if isinstance(other, set | frozenset):
            return len(other) == len(self._hashes) and all(hash(key) in self._hashes for key in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def add(self, key: Key) -> None:
        self._hashes.add(hash(key))

    def discard(self, key: Key) -> None:
        self._hashes.discard(hash(key))

    def update(self, keys: Iterable[Key]) -> None:
        self._hashes.update(hash(key) for key in keys)

    def isdisjoint(self, keys: Iterable[Key]) -> bool:
        hashes = self._hashes
        return not any(hash(key) in hashes for key in keys)


RECORD_FIELDS: tuple[str, ...] = (
    "id", "sample", "input_ids", "output_ids", "finish_reason", "prompt_tokens", "completion_tokens",
    "cached_tokens", "latency_s", "done_at", "server", "attempts", "has_tools", "flags", "line", "prompt_hash", "run",
    "turn", "thinking", "answer_content", "answer_reasoning", "answer_tool_calls", "num_retractions",
    "source_fields",
)  # fmt: skip


# --- layout ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputLayout:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def run_file(self) -> Path:
        """The run's manifest, kept with its data: what `datagen verify OUTPUT` and `datagen export` read."""
        return self.root / "run.yaml"

    @property
    def manifest_lock(self) -> Path:
        return self.root / ".manifest.lock"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def shard_dir(self, index: int) -> Path:
        return self.shards_dir / f"{index:05d}"

    def parquet(self, index: int, count: int) -> Path:
        return self.data_dir / f"shard-{index:05d}-of-{count:05d}.parquet"

    def progress(self, index: int) -> Path:
        return self.shard_dir(index) / "progress.json"

    def rejects(self, index: int) -> Path:
        return self.shard_dir(index) / "rejects.jsonl"

    @property
    def volume_full(self) -> Path:
        """Left by a shard that found the volume full: the other shards send no new request (worker.volume_guard)."""
        return self.shards_dir / ".volume-full"

    def reserve(self, index: int) -> Path:
        """Space a running shard holds for its last words on a full volume (RESERVE_BYTES)."""
        return self.shard_dir(index) / ".reserve"

    def segments(self, index: int) -> list[Path]:
        return sorted(self.shard_dir(index).glob("segment-*.jsonl"))


def keys_path(segment: Path) -> Path:
    return segment.with_suffix(".keys.json")


def segment_seq(segment: Path) -> int:
    return int(segment.stem.split("-", 1)[1])


def shard_indices(layout: OutputLayout) -> list[int]:
    indices: set[int] = set()
    if layout.shards_dir.is_dir():
        indices.update(int(p.name) for p in layout.shards_dir.iterdir() if p.name.isdigit())
    if layout.data_dir.is_dir():
        for path in layout.data_dir.glob("shard-*-of-*.parquet"):
            indices.add(int(path.name.split("-")[1]))
    return sorted(indices)


# --- small file helpers ----------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write to a temporary file and rename it over `path`: readers see the old or the new, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as file:
            file.write(data)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full volume must not collect empty temporaries
        raise
    if durable:
        fsync_dir(path.parent)


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(chunk):
            digest.update(block)
    return digest.hexdigest()
