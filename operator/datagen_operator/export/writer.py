"""Output files of a bounded size: a new part starts once the current one reaches `max_bytes`.

Parts are written under a temporary name and renamed when closed, so a `part-*` file is always whole;
the export manifest, written last, lists them (its presence means the export finished).

Writing, compressing and hashing run on one background thread (they release the GIL), fed through a
queue of two batches: they overlap with reading and formatting the next batch, and memory stays at a
few batches.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from datagen_operator.output.layout import fsync_dir, sha256_file

DEFAULT_PART_BYTES = 512 * 1024 * 1024
PART_GLOB = "part-*"
WRITE_BATCH_VALUES = 64 * 1024
"""Values the Parquet encoder takes between page-size checks (ParquetParts)."""


@dataclass
class PartInfo:
    name: str
    rows: int = 0
    tokens: int = 0
    bytes: int = 0
    sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "tokens": self.tokens, "bytes": self.bytes, "sha256": self.sha256}


class _RollingParts:
    suffix = ""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_PART_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.parts: list[PartInfo] = []
        self._current: PartInfo | None = None
        self._tasks: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run_tasks, name="export-writer", daemon=True)
        self._thread.start()

    def _run_tasks(self) -> None:
        while (task := self._tasks.get()) is not None:
            if self._error is None:
                function, args = task
                try:
                    function(*args)
                except BaseException as error:  # re-raised in the caller's thread
                    self._error = error

    def _submit(self, function: Callable[..., None], *args: Any) -> None:
        if self._error is not None:
            raise self._error
        self._tasks.put((function, args))

    def _path(self, part: PartInfo, *, temporary: bool = False) -> Path:
        return self.directory / (f".{part.name}.tmp" if temporary else part.name)

    def _start(self) -> PartInfo:
        part = PartInfo(f"part-{len(self.parts):05d}{self.suffix}")
        self.parts.append(part)
        self._current = part
        self._open(self._path(part, temporary=True))
        return part

    def _finish(self) -> None:
        part = self._current
        if part is None:
            return
        self._close()
        temporary, final = self._path(part, temporary=True), self._path(part)
        with temporary.open("rb") as file:
            os.fsync(file.fileno())
        os.replace(temporary, final)
        part.bytes, part.sha256 = final.stat().st_size, self._digest(final)
        self._current = None

    def _digest(self, path: Path) -> str:
        return sha256_file(path)

    def _account(self, rows: int, tokens: int, size_now: int) -> None:
        assert self._current is not None
        self._current.rows += rows
        self._current.tokens += tokens
        if size_now >= self.max_bytes:
            self._finish()

    def close(self) -> list[PartInfo]:
        self._tasks.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._finish()
        fsync_dir(self.directory)
        return self.parts

    # per file type
    def _open(self, path: Path) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class JsonlParts(_RollingParts):
    suffix = ".jsonl"
    WRITE_BUFFER = 8 * 1024 * 1024

    def _open(self, path: Path) -> None:
        self._file = path.open("wb", buffering=self.WRITE_BUFFER)
        self._size = 0
        self._hash = hashlib.sha256()  # as written: no second read of the part

    def _close(self) -> None:
        self._file.close()

    def _digest(self, path: Path) -> str:
        return self._hash.hexdigest()

    def write_lines(self, lines: list[bytes], tokens: int) -> None:
        """Lines of one batch (each ends in a newline) go into one part; a part may exceed max_bytes by one batch."""
        if lines:
            self._submit(self._write_now, lines, tokens)

    def _write_now(self, lines: list[bytes], tokens: int) -> None:
        if self._current is None:
            self._start()
        data = b"".join(lines)
        self._file.write(data)
        self._hash.update(data)
        self._size += len(data)
        self._account(len(lines), tokens, self._size)


class ParquetParts(_RollingParts):
    suffix = ".parquet"

    def __init__(self, directory: Path, schema: pa.Schema, max_bytes: int = DEFAULT_PART_BYTES) -> None:
        super().__init__(directory, max_bytes)
        self.schema = schema

    def _open(self, path: Path) -> None:
        # Hashed as Arrow writes it (as JsonlParts does): no second read of the part, and the last part's
        # digest is not a serial pass after the writer thread is done.
        self._sink = _HashingFile(path.open("wb"))
        # Dictionaries and min/max statistics on token lists cost CPU and help no reader: only on short strings/keys.
        # The encoder checks the page size every `write_batch_size` values: Arrow's 1,024 made that check and
        # its per-batch level bookkeeping a sixth of the writer thread's CPU on token lists, which bounds the
        # export. Pages may overrun `data_page_size` (1 MB) by one batch (256 KB of int32); the values are the same.
        self._writer = pq.ParquetWriter(
            self._sink,
            self.schema,
            compression="zstd",
            use_dictionary=["id", "finish_reason", "flags.list.element"],
            write_statistics=["id", "sample"],
            write_batch_size=WRITE_BATCH_VALUES,
        )

    def _close(self) -> None:
        self._writer.close()
        self._sink.close()

    def _digest(self, path: Path) -> str:
        return self._sink.hexdigest()

    def write_table(self, table: pa.Table, tokens: int) -> None:
        """One row group per call: the file on disk grows with each, which is what the size bound reads."""
        if table.num_rows:
            self._submit(self._write_now, table, tokens)

    def _write_now(self, table: pa.Table, tokens: int) -> None:
        if self._current is None:
            self._start()
        self._writer.write_table(table)
        self._account(table.num_rows, tokens, self._sink.written)


class _HashingFile:
    """The file a ParquetWriter writes to, counting the bytes and hashing them (sha256) on a thread of its own:
    hashlib releases the GIL, so the digest costs the encoder's thread (which bounds the export) nothing."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.written = 0
        self._hash = hashlib.sha256()
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="export-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self._hash.update(chunk)

    def write(self, data: bytes) -> int:
        self._chunks.put(bytes(data))  # Arrow hands a bytes copy already; bytes() of bytes is the same object
        self.written += len(data)
        return self.file.write(data)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        self.file.flush()

    @property
    def closed(self) -> bool:
        return self.file.closed

    def close(self) -> None:
        self.file.close()

    def hexdigest(self) -> str:
        """The digest of every byte written; call once, after close."""
        self._chunks.put(None)
        self._thread.join()
        return self._hash.hexdigest()
