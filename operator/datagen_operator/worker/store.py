"""The output directory: append-only segments, resume index, Parquet compaction, manifest, readers.

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
whole line (ending in a newline) is in a segment, so resume is exactly-once by (id, sample): what is
in the files is skipped, everything else is generated again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

Key = tuple[str, int]


class KeySet:
    """A set of (id, sample) keys held as their 64-bit hashes (Python's, consistent within one process):
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

    def add_hash(self, value: int) -> None:
        self._hashes.add(value)

    def discard(self, key: Key) -> None:
        self._hashes.discard(hash(key))

    def update(self, keys: Iterable[Key]) -> None:
        self._hashes.update(hash(key) for key in keys)

    def isdisjoint(self, keys: Iterable[Key]) -> bool:
        hashes = self._hashes
        return not any(hash(key) in hashes for key in keys)


"""(prompt id, sample index): the identity of a record."""

RECORD_FIELDS: tuple[str, ...] = (
    "id", "sample", "input_ids", "output_ids", "finish_reason", "prompt_tokens", "completion_tokens",
    "cached_tokens", "latency_s", "server", "attempts", "has_tools", "flags",
)  # fmt: skip
MANIFEST_FORMAT = "datagen-output/v1"
SEGMENT_ROLL_BYTES = 256 * 1024 * 1024
RESERVE_BYTES = 256 * 1024
"""Held per shard while it runs (shards/<i>/.reserve) and freed when the volume fails: room to write a
true progress.json and manifest entry on a volume that is otherwise full."""


# --- a failing output volume -----------------------------------------------------------------------

VOLUME_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
"""Write failures that are the volume's, not this program's: retrying on the same volume cannot help."""
VOLUME_REASONS = {
    errno.ENOSPC: "OutputVolumeFull",
    errno.EDQUOT: "OutputVolumeFull",
    errno.EROFS: "OutputVolumeReadOnly",
    errno.EIO: "OutputVolumeError",
}


def is_volume_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in VOLUME_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Free bytes (for this user) of the filesystem holding `path` or its nearest existing parent."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def volume_failure_text(reason: str, output: str | Path, free: int | None, done: int, total: int, why: str = "") -> str:
    """The cause in plain words and what to do: the same sentence on stderr, in progress and the condition."""
    what = {
        "OutputVolumeFull": f"{output} has {free if free is not None else 'an unknown number of'} bytes free",
        "OutputVolumeReadOnly": f"{output} is read-only",
    }.get(reason, f"{output} fails to write")
    fix = {
        "OutputVolumeFull": "free space or grow the volume and the run resumes",
        "OutputVolumeReadOnly": "mount the volume writable and the run resumes",
    }.get(reason, "repair or replace the volume and the run resumes")
    return f"{what} after {done}/{total} records" + (f" ({why})" if why else "") + f"; {fix}"


class PartialFlush(OSError):
    """A flush that failed part-way: the whole records before the failure are kept, the rest is not written."""

    def __init__(self, error: OSError, unwritten: int) -> None:
        super().__init__(error.errno, error.strerror, error.filename)
        self.unwritten = unwritten


# --- layout ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputLayout:
    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

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

    def reserve(self, index: int) -> Path:
        """Space a running shard holds for its last words on a full volume (RESERVE_BYTES)."""
        return self.shard_dir(index) / ".reserve"

    def segments(self, index: int) -> list[Path]:
        return sorted(self.shard_dir(index).glob("segment-*.jsonl"))


def keys_path(segment: Path) -> Path:
    return segment.with_suffix(".keys.json")


def segment_seq(segment: Path) -> int:
    return int(segment.stem.split("-", 1)[1])


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


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def manifest_lock(layout: OutputLayout) -> Iterator[None]:
    """Serialises manifest read-modify-write between shard processes (flock; works on local and NFSv4)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with layout.manifest_lock.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def read_manifest(output_dir: str | Path) -> dict[str, Any] | None:
    """The run's manifest.json, or None before any worker has started."""
    path = OutputLayout(Path(output_dir)).manifest
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def update_manifest(layout: OutputLayout, change: Any) -> dict[str, Any]:
    """Apply `change(manifest_or_None) -> manifest` under the lock and write it atomically."""
    with manifest_lock(layout):
        current = read_manifest(layout.root)
        updated = change(current)
        updated["updated_at"] = time.time()
        updated["counts"] = _total_counts(updated.get("shards", {}))
        write_atomic(layout.manifest, orjson.dumps(updated, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        return updated


def _total_counts(shards: dict[str, dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for entry in shards.values():
        for name, value in entry.get("counts", {}).items():
            if isinstance(value, int):
                totals[name] += value
    totals["shards_complete"] = sum(1 for entry in shards.values() if entry.get("state") == "complete")
    return dict(totals)


# --- record summaries (what progress counters are rebuilt from on restart) -------------------------


@dataclass
class Summary:
    """Exact counts over a set of records; kept per sealed segment so restarts need not re-read data."""

    records: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    flags: Counter[str] = field(default_factory=Counter)

    def add(self, prompt_tokens: int, output_tokens: int, cached_tokens: int, flags: Iterable[str]) -> None:
        self.records += 1
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        self.cached_tokens += cached_tokens
        if flags:
            self.flags.update(flags)

    def add_record(self, record: dict[str, Any]) -> None:
        self.add(len(record["input_ids"]), len(record["output_ids"]), record.get("cached_tokens") or 0, record["flags"])

    def merge(self, other: Summary) -> None:
        self.records += other.records
        self.prompt_tokens += other.prompt_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.flags.update(other.flags)

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "flags": dict(self.flags),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        return cls(
            data["records"], data["prompt_tokens"], data["output_tokens"], data["cached_tokens"], Counter(data["flags"])
        )


# --- segments --------------------------------------------------------------------------------------


@dataclass
class SegmentScan:
    entries: list[tuple[str, int, int, int]]
    """(id, sample, byte offset, byte length) of each valid record line."""
    summary: Summary
    valid_bytes: int
    """Length of the prefix that ends with the last complete line."""
    torn_bytes: int
    corrupt_lines: int


def _complete_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(offset, line without newline) for each newline-terminated line; a trailing partial line is skipped."""
    start = 0
    end = data.find(b"\n", start)
    while end != -1:
        yield start, data[start:end]
        start = end + 1
        end = data.find(b"\n", start)


def parse_record_line(line: bytes) -> dict[str, Any] | None:
    """A record from a segment line, or None if the line is damaged (e.g. zeros after a power loss)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("id"), str)
        or not isinstance(record.get("sample"), int)
        or not isinstance(record.get("output_ids"), list)
        or not isinstance(record.get("input_ids"), list)
    ):
        return None
    return record


def scan_segment_bytes(data: bytes) -> SegmentScan:
    entries: list[tuple[str, int, int, int]] = []
    summary = Summary()
    corrupt = 0
    valid_bytes = data.rfind(b"\n") + 1
    for offset, line in _complete_lines(data):
        if not line.strip():
            continue
        record = parse_record_line(line)
        if record is None:
            corrupt += 1
            continue
        entries.append((record["id"], record["sample"], offset, len(line) + 1))
        summary.add_record(record)
    return SegmentScan(entries, summary, valid_bytes, len(data) - valid_bytes, corrupt)


def load_sealed_keys(segment: Path) -> SegmentScan | None:
    """The keys file of a sealed segment, if it matches the segment's current size."""
    try:
        data = orjson.loads(keys_path(segment).read_bytes())
        size = segment.stat().st_size
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if data.get("bytes") != size:
        return None
    entries = [tuple(entry) for entry in data["entries"]]
    return SegmentScan(entries, Summary.from_json(data["summary"]), size, 0, data.get("corrupt_lines", 0))  # type: ignore[arg-type]


def seal_segment(segment: Path, scan: SegmentScan) -> None:
    body = {
        "bytes": scan.valid_bytes,
        "entries": scan.entries,
        "summary": scan.summary.to_json(),
        "corrupt_lines": scan.corrupt_lines,
    }
    write_atomic(keys_path(segment), orjson.dumps(body))


def recover_segment(segment: Path) -> SegmentScan:
    """Seal a segment a previous run left behind: drop a torn tail, index its records."""
    sealed = load_sealed_keys(segment)
    if sealed is not None:
        return sealed
    data = segment.read_bytes()
    scan = scan_segment_bytes(data)
    if scan.torn_bytes:
        with segment.open("r+b") as file:
            file.truncate(scan.valid_bytes)
            os.fsync(file.fileno())
    seal_segment(segment, scan)
    return scan


# --- the writer ------------------------------------------------------------------------------------


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
        self.summary = Summary()
        """What `recover` found on disk (the worker's progress tracker counts from there on)."""
        self.written = Summary()
        """Records this writer put on disk whole (with `summary`: exactly what the shard holds)."""
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._segment: Path | None = None
        self._fd = -1
        self._size = 0
        self._entries: list[tuple[str, int, int, int]] = []
        self._segment_summary = Summary()
        self._pending: list[tuple[str, int, int, tuple[int, int, int, list[str]]]] = []
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
            keys = [(entry[0], entry[1]) for entry in scan.entries]
            if self.done.isdisjoint(keys):
                self.done.update(keys)
                self.summary.merge(scan.summary)
                continue
            # Overlap only after a crash between compaction and segment removal: count new keys one by one.
            for record in _segment_records(segment):
                key = (record["id"], record["sample"])
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
        for _, line in _complete_lines(data[:valid]):
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
        self._segment_summary = Summary()
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
        )
        self._pending.append((record["id"], record["sample"], len(line), counts))
        self._buffer.append(line)
        self._buffered += len(line)
        self.done.add((record["id"], record["sample"]))

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

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
        for prompt_id, sample, length, counts in self._pending:
            if landed + length > written:
                break
            self._entries.append((prompt_id, sample, offset, length))
            self._segment_summary.add(*counts)
            self.written.add(*counts)
            offset += length
            landed += length
            kept += 1
        dropped = self._pending[kept:]
        for prompt_id, sample, _, _ in dropped:
            self.done.discard((prompt_id, sample))
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
        from datagen_operator.worker.records import reject_cause

        key = str(entry.get("key"))
        self.reject_keys.add(key)
        if entry.get("kind") == "server" and isinstance(entry.get("id"), str):
            self.rejected.add((entry["id"], int(entry.get("sample", 0))))
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


# --- Parquet ---------------------------------------------------------------------------------------


def parquet_schema() -> Any:
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
            ("server", pa.string()),
            ("attempts", pa.int32()),
            ("has_tools", pa.bool_()),
            ("flags", pa.list_(pa.string())),
        ]
    )


def parquet_keys_and_summary(path: Path, keys: KeySet) -> Summary:
    """Exact counts of a compacted shard (token counts are list lengths, as in Summary); its keys are added
    to `keys`."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    summary = Summary()
    columns = ["id", "sample", "input_ids", "output_ids", "cached_tokens", "flags"]
    for batch in pq.ParquetFile(path).iter_batches(columns=columns, batch_size=8192):
        ids, samples = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        keys.update(zip(ids, samples, strict=True))
        summary.records += len(ids)
        summary.prompt_tokens += int(pc.sum(pc.list_value_length(batch.column(2))).as_py() or 0)
        summary.output_tokens += int(pc.sum(pc.list_value_length(batch.column(3))).as_py() or 0)
        summary.cached_tokens += int(pc.sum(batch.column(4)).as_py() or 0)
        for flags in batch.column(5).to_pylist():
            if flags:
                summary.flags.update(flags)
    return summary


class _ColumnBatch:
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

    def table(self) -> Any:
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
            for prompt_id, sample, offset, length in recover_segment(segment).entries:
                hashes.append(hash((prompt_id, sample)))
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

    def unused(self) -> Any:
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
            previous[(row["id"], row["sample"])] = row

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
        batch = _ColumnBatch()

        def emit(record: dict[str, Any]) -> None:
            nonlocal batch, rows, tokens
            batch.add(record)
            rows += 1
            tokens += len(record["input_ids"]) + len(record["output_ids"])
            if batch.tokens >= ROW_GROUP_TOKENS or batch.rows >= ROW_GROUP_ROWS:
                writer.write_table(batch.table())
                batch = _ColumnBatch()

        def from_segments(key: Key) -> dict[str, Any] | None:
            at = sources.find(key)
            if at < 0 or sources.used[at]:
                return None
            record = sources.read(at)
            if record is None or (record["id"], record["sample"]) != key:
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
            if record is None or (record["id"], record["sample"]) in written:
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


# --- public readers --------------------------------------------------------------------------------


def _parquet_records(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            row["finish_reason"] = orjson.loads(row["finish_reason"]) if row["finish_reason"] else None
            yield row


def _segment_records(segment: Path) -> Iterator[dict[str, Any]]:
    """Records of one segment, read-only: a partial last line (still being written) is skipped."""
    try:
        data = segment.read_bytes()
    except FileNotFoundError:
        return  # removed by a compaction that just finished
    for _, line in _complete_lines(data):
        record = parse_record_line(line)
        if record is not None:
            yield record


def _shard_indices(layout: OutputLayout) -> list[int]:
    indices: set[int] = set()
    if layout.shards_dir.is_dir():
        indices.update(int(p.name) for p in layout.shards_dir.iterdir() if p.name.isdigit())
    if layout.data_dir.is_dir():
        for path in layout.data_dir.glob("shard-*-of-*.parquet"):
            indices.add(int(path.name.split("-")[1]))
    return sorted(indices)


def iter_shard_records(output_dir: str | Path, shard_index: int) -> Iterator[dict[str, Any]]:
    layout = OutputLayout(Path(output_dir))
    # Keys by their 64-bit hash: a million records hold 64 MB here, not the keys' strings and tuples.
    seen: set[int] = set()

    def from_parquet() -> Iterator[dict[str, Any]]:
        for parquet in sorted(layout.data_dir.glob(f"shard-{shard_index:05d}-of-*.parquet")):
            for record in _parquet_records(parquet):
                key = hash((record["id"], record["sample"]))
                if key not in seen:
                    seen.add(key)
                    yield record

    had_parquet = any(layout.data_dir.glob(f"shard-{shard_index:05d}-of-*.parquet"))
    yield from from_parquet()
    segments = layout.segments(shard_index)
    for segment in segments:
        for record in _segment_records(segment):
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
    for index in _shard_indices(layout):
        yield from iter_shard_records(output_dir, index)


def iter_rejects(output_dir: str | Path) -> Iterator[dict[str, Any]]:
    layout = OutputLayout(Path(output_dir))
    for index in _shard_indices(layout):
        path = layout.rejects(index)
        if not path.exists():
            continue
        for _, line in _complete_lines(path.read_bytes()):
            with contextlib.suppress(orjson.JSONDecodeError):
                yield orjson.loads(line)


def read_progress(output_dir: str | Path) -> list[Any]:
    """The latest progress.json of each shard, as ShardProgress, ordered by shard index."""
    from datagen_operator.worker.progress import ShardProgress

    layout = OutputLayout(Path(output_dir))
    out = []
    for index in _shard_indices(layout):
        path = layout.progress(index)
        try:
            out.append(ShardProgress.from_json(orjson.loads(path.read_bytes())))
        except (FileNotFoundError, orjson.JSONDecodeError):
            continue
    return out
