"""The one writer of a shard: appends records and rejects, flushes and syncs, recovers after a crash."""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.progress import Counts
from datagen_operator.output.layout import Key, KeySet, OutputLayout, fsync_dir, record_key, segment_seq
from datagen_operator.output.manifest import manifest_lock
from datagen_operator.output.parquet import parquet_keys_and_summary
from datagen_operator.output.segments import SegmentScan, complete_lines, recover_segment, seal_segment, segment_records
from datagen_operator.output.volume import PartialFlush, is_volume_error

SEGMENT_ROLL_BYTES = 256 * 1024 * 1024
RESERVE_BYTES = 256 * 1024
"""Held per shard while it runs (shards/<i>/.reserve) and freed when the volume fails: room to write a
true progress.json and manifest entry on a volume that is otherwise full."""


# --- the writer ------------------------------------------------------------------------------------


def remove_stale_temporaries(layout: OutputLayout, shard_index: int) -> int:
    """Temporaries a dead writer left (a kill, a full volume): this shard's own, and the manifest's under
    its lock (every manifest write holds it, so no live writer owns one then)."""
    removed = 0
    shard_dir = layout.shard_dir(shard_index)
    patterns = [
        (shard_dir, ".progress.json.*.tmp"),
        (shard_dir, ".segment-*.keys.json.*.tmp"),
        (layout.data_dir, f".shard-{shard_index:05d}-of-*.parquet.*.tmp"),
        (layout.root, f".run.yaml.{shard_index}.tmp"),
    ]
    for folder, pattern in patterns:
        for path in folder.glob(pattern) if folder.is_dir() else ():
            path.unlink(missing_ok=True)
            removed += 1
    if layout.root.is_dir():
        with manifest_lock(layout):
            for path in layout.root.glob(".manifest.json.*.tmp"):
                path.unlink(missing_ok=True)
                removed += 1
    return removed


@dataclass
class RecoveryReport:
    records: int
    torn_bytes: int
    corrupt_lines: int
    segments: int
    compacted_records: int


class ShardWriter:
    """Appends records and rejects for one shard. Single writer per shard (the Job runs one pod per index).

    Durability: `append` buffers encoded lines; `flush` hands them to the OS with one write() (survives a
    process kill); `sync` fsyncs (survives a node crash). The worker flushes after every record and
    syncs every 2 s and on shutdown; see docs/worker.md.
    """

    def __init__(self, layout: OutputLayout, shard_index: int, *, roll_bytes: int = SEGMENT_ROLL_BYTES) -> None:
        self.layout = layout
        self.shard_index = shard_index
        self.dir = layout.shard_dir(shard_index)
        self.roll_bytes = roll_bytes
        self.done = KeySet()
        self.rejected: set[Key] = set()
        self.reject_keys: set[str] = set()
        self.set_aside: dict[str, str] = {}
        """line:<n> -> cause, for every line set aside (dataset lines, unrenderable and too-long prompts)."""
        self.turns_cut: dict[tuple[str, int], int] = {}
        """(id, sample) -> the first of a conversation's turns never sent (records.turns_reject)."""
        self.turns_cut_records = 0
        """The turns those entries say were never sent."""
        self.summary = Counts()
        """What `recover` found on disk (the worker's progress tracker counts from there on)."""
        self.written = Counts()
        """Records this writer put on disk whole (with `summary`: exactly what the shard holds)."""
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._segment: Path | None = None
        self._fd = -1
        self._size = 0
        self._entries: list[tuple[str, int, int, int, int]] = []
        self._segment_summary = Counts()
        self._pending: list[tuple[Key, int, tuple[int, int, int, list[str], bool]]] = []
        """(key, line length, Counts.add arguments) of the buffered lines."""
        self._rejects_fd = -1
        self._dirty = False

    # recovery

    def recover(self, compacted: Path | None = None) -> RecoveryReport:
        """Index what is already recorded (compacted Parquet and segments); repair torn tails."""
        self.dir.mkdir(parents=True, exist_ok=True)
        torn = corrupt = compacted_records = 0
        if compacted is not None and compacted.exists():
            summary = parquet_keys_and_summary(compacted, self.done)
            self.summary.merge(summary)
            compacted_records = summary.records
        segments = self.layout.segments(self.shard_index)
        for segment in segments:
            scan = recover_segment(segment)
            torn += scan.torn_bytes
            corrupt += scan.corrupt_lines
            keys = [(entry[0], entry[1], entry[2]) for entry in scan.entries]
            if self.done.isdisjoint(keys):
                self.done.update(keys)
                self.summary.merge(scan.summary)
                continue
            # Overlap only after a crash between compaction and segment removal: count new keys one by one.
            for record in segment_records(segment):
                key = record_key(record)
                if key not in self.done:
                    self.done.add(key)
                    self.summary.add_record(record)
        self._recover_rejects()
        return RecoveryReport(len(self.done), torn, corrupt, len(segments), compacted_records)

    def _recover_rejects(self) -> None:
        path = self.layout.rejects(self.shard_index)
        if not path.exists():
            return
        data = path.read_bytes()
        valid = data.rfind(b"\n") + 1
        if valid != len(data):
            with path.open("r+b") as file:
                file.truncate(valid)
                os.fsync(file.fileno())
        for _, line in complete_lines(data[:valid]):
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(entry, dict):
                continue
            self._index_reject(entry)

    # appending

    def open_segment(self) -> None:
        """Start a fresh segment for this run (never append after a possibly torn tail)."""
        existing = self.layout.segments(self.shard_index)
        seq = segment_seq(existing[-1]) + 1 if existing else 1
        self._segment = self.dir / f"segment-{seq:06d}.jsonl"
        self._fd = os.open(self._segment, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        self._entries = []
        self._segment_summary = Counts()
        fsync_dir(self.dir)

    def append(self, record: dict[str, Any], line: bytes | None = None) -> None:
        """Buffer one record; `line` is its encoding when the caller has it (records.encode_record)."""
        if line is None:
            line = orjson.dumps(record) + b"\n"
        # Keep only counts until the flush: holding whole records would keep their token lists alive.
        counts = (
            len(record["input_ids"]),
            len(record["output_ids"]),
            record.get("cached_tokens") or 0,
            record["flags"],
            bool(record.get("has_tools")),
        )
        key = record_key(record)
        self._pending.append((key, len(line), counts))
        self._buffer.append(line)
        self._buffered += len(line)
        self.done.add(key)

    def flush(self) -> None:
        """Write the buffered lines with one write(). When the volume fails part-way (ENOSPC, EIO), the
        whole records before the failure stay, the torn rest is cut off, and PartialFlush says how many
        records were not written (they are not `done`: a rerun generates them)."""
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        written = 0
        try:
            if self._fd < 0:
                self.open_segment()
            view = memoryview(data)
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError as error:
            unwritten = self._keep_whole_records(written)
            raise PartialFlush(error, unwritten) from error
        self._keep_whole_records(written)
        self._dirty = True
        if self._size >= self.roll_bytes:
            self._seal_current()

    def _keep_whole_records(self, written: int) -> int:
        """Index the buffered records that landed whole within `written` bytes; drop the others (cutting a
        torn line off the segment). Returns how many were dropped."""
        offset, landed, kept = self._size, 0, 0
        for key, length, counts in self._pending:
            if landed + length > written:
                break
            self._entries.append((*key, offset, length))
            self._segment_summary.add(*counts)
            self.written.add(*counts)
            offset += length
            landed += length
            kept += 1
        dropped = self._pending[kept:]
        for key, _, _ in dropped:
            self.done.discard(key)
        if landed != written and self._fd >= 0:
            with contextlib.suppress(OSError):  # shrinking frees space; recovery cuts it otherwise
                os.ftruncate(self._fd, offset)
        self._size = offset
        self._buffer.clear()
        self._pending.clear()
        self._buffered = 0
        return len(dropped)

    def sync(self) -> None:
        """fsync what has been flushed (call from a thread: it can take long on network storage). A volume
        failure (EIO, ENOSPC on delayed allocation) is raised; other errors (a closed fd) are not."""
        for fd in (self._fd, self._rejects_fd):
            if fd < 0:
                continue
            try:
                os.fsync(fd)
            except OSError as error:
                if is_volume_error(error):
                    raise
        self._dirty = False

    def hold_reserve(self, size: int = RESERVE_BYTES) -> None:
        """Take `size` bytes of the volume now (raises a volume error when even that is not free)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.layout.reserve(self.shard_index)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as error:
                    if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.write(fd, bytes(size))  # no fallocate here: real blocks all the same
            finally:
                os.close(fd)
        except OSError:
            path.unlink(missing_ok=True)
            raise

    def release_reserve(self) -> None:
        self.layout.reserve(self.shard_index).unlink(missing_ok=True)

    def abort(self) -> None:
        """The end after a volume failure: what is buffered is dropped, whole records stay, fds close.
        Nothing is sealed (that needs space); the next start indexes the segment from its lines."""
        self._keep_whole_records(0)
        for fd in (self._fd, self._rejects_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._rejects_fd = -1
        self._segment = None

    def _seal_current(self) -> None:
        if self._fd < 0 or self._segment is None:
            return
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        seal_segment(self._segment, SegmentScan(self._entries, self._segment_summary, self._size, 0, 0))
        self._segment = None

    def add_reject(self, entry: dict[str, Any]) -> bool:
        """Append a reject once per key; True if it was new."""
        key = str(entry["key"])
        if key in self.reject_keys:
            return False
        if self._rejects_fd < 0:
            self._rejects_fd = os.open(
                self.layout.rejects(self.shard_index), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
            )
        os.write(self._rejects_fd, orjson.dumps(entry) + b"\n")
        self._index_reject(entry)
        return True

    def _index_reject(self, entry: dict[str, Any]) -> None:
        from datagen_operator.output.records import TURNS_KIND, reject_cause

        key = str(entry.get("key"))
        self.reject_keys.add(key)
        kind, prompt_id = entry.get("kind"), entry.get("id")
        if kind == "server" and isinstance(prompt_id, str):
            self.rejected.add((prompt_id, int(entry.get("sample", 0)), int(entry.get("turn") or 0)))
        elif kind == TURNS_KIND and isinstance(prompt_id, str):
            conversation = (prompt_id, int(entry.get("sample", 0)))
            turn = int(entry.get("turn") or 0)
            self.turns_cut[conversation] = min(turn, self.turns_cut.get(conversation, turn))
            self.turns_cut_records += max(0, int(entry.get("turns") or 0) - turn)
        elif key.startswith("line:"):
            self.set_aside[key] = reject_cause(entry)

    def close(self) -> None:
        """Flush, fsync and seal: the clean end of a run (drain, completion)."""
        self.flush()
        if self._fd >= 0 and self._size == 0 and self._segment is not None:
            # Nothing written in this run: leave no empty segment behind.
            os.close(self._fd)
            self._fd = -1
            self._segment.unlink(missing_ok=True)
            self._segment = None
        self._seal_current()
        if self._rejects_fd >= 0:
            os.fsync(self._rejects_fd)
            os.close(self._rejects_fd)
            self._rejects_fd = -1
