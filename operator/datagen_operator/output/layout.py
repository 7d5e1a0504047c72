"""Where a run's output lives on its volume, and the small file operations every writer uses.

Layout (shared by all shards of a run):

    manifest.json                         fingerprint, shard count, per-shard counts and Parquet checksums
    shards/<index:05d>/segment-<seq:06d>.jsonl       records, one JSON object a line, append-only
    shards/<index:05d>/segment-<seq:06d>.keys.json   written when a segment is sealed: keys, offsets, summary
    shards/<index:05d>/rejects.jsonl       malformed dataset lines and records the server refused (400)
    shards/<index:05d>/progress.json       counters, rewritten atomically every few seconds
    data/shard-<index:05d>-of-<count:05d>.parquet    after compaction, rows in dataset order
    run.yaml, lease.json, .lease.lock      the run's manifest; who writes the output now, and its lock
    dataset.pin.json, dataset.lines.u64    the dataset as first read, a hash a line
    rendered/, claims/                     the prompts' rendered ids; which chunks of a shard are claimed
    canary.jsonl, canary.verdict.json      the canary's records and (`datagen run`) its passed verdict
    logs/, processes.json                  `datagen run`: its children's logs and ids
    <spec.export.path>/<format>/           the exported trainer formats

Every file is a property of OutputLayout; the names other layers need too are api/output_files.py's.

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

from datagen_operator.api.output_files import CANARY_RECORDS, DATASET_LINE_HASHES, DATASET_PIN, LINE_HASH_BYTES

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

    @property
    def dataset_pin(self) -> Path:
        """The dataset's identity as the run first read it (prompts/pin.py)."""
        return self.root / DATASET_PIN

    @property
    def dataset_line_hashes(self) -> Path:
        return self.root / DATASET_LINE_HASHES

    @property
    def rendered(self) -> Path:
        """The rendered prompts' ids, reused by every shard and a resume (output/rendered.py)."""
        return self.root / "rendered"

    @property
    def claims(self) -> Path:
        """The chunks of a shard claimed by its worker or a stealing one (output/steal.py)."""
        return self.root / "claims"

    @property
    def lease(self) -> Path:
        """Who writes this output now, so a second run on it is refused (output/lease.py)."""
        return self.root / "lease.json"

    @property
    def lease_lock(self) -> Path:
        """A directory held while the lease is read and rewritten (mkdir is atomic)."""
        return self.root / ".lease.lock"

    @property
    def canary_records(self) -> Path:
        return self.root / CANARY_RECORDS

    @property
    def canary_verdict(self) -> Path:
        """A passed canary's verdict with the key it holds for, so `datagen run` does not rerun it on a resume."""
        return self.root / "canary.verdict.json"

    @property
    def logs(self) -> Path:
        """The servers' and workers' logs of `datagen run`."""
        return self.root / "logs"

    @property
    def processes(self) -> Path:
        """The children `datagen run` started, for a later run to stop should this one be killed."""
        return self.root / "processes.json"

    def export_dir(self, path: str) -> Path:
        """spec.export.path: the folder the trainer formats are written to, each in its own subfolder."""
        return self.root / path


FILE_BLOCK = 4096
"""The smallest a file takes on common filesystems (ext4, xfs)."""


def bookkeeping_bytes(dataset_lines: int) -> int:
    """What the manifest and the dataset pin take on the volume: a block each, the pin's line hashes in whole
    blocks. (run.yaml and the lease are written before the preflight measures the free space.)"""
    line_hashes = -(-LINE_HASH_BYTES * dataset_lines // FILE_BLOCK) * FILE_BLOCK
    return 2 * FILE_BLOCK + line_hashes


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
