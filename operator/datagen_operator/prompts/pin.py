"""The dataset pinned to its output: its size, a content hash, and a 64-bit hash per line (row), recorded by the
preflight and compared by every later reader (the workers at start and end, a resume's preflight, verify), so an
edit, a deletion or an append under a run is named by line and id instead of mixing two datasets in one output.

The pin is two files in the output directory: `dataset.pin.json` (path, format, lines, bytes, sha256) and
`dataset.lines.u64` (the line hashes, little-endian uint64, one per physical line or Parquet row: 8 bytes a line).

A line's hash is `prompt_hash` of the object it parses to (keys sorted), so the worker hashes the very object
it sends and stores that hash with each record; `datagen verify` then checks every record against the pin. A line
that does not parse is hashed as its bytes; a blank line is 0.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from datagen_operator.prompts.dataset import UTF8_BOM, DatasetFormat, detect_format, normalise_parquet_row

PIN_FILE = "dataset.pin.json"
LINES_FILE = "dataset.lines.u64"
NAMED = 5
"""Changed lines named in a message; the rest are counted."""


@dataclass(frozen=True)
class DatasetPin:
    path: str
    format: str
    lines: int
    bytes: int
    sha256: str
    line_hashes: Any
    """np.ndarray[uint64]: one per line (row)."""
    rendered_on: str
    """UTC date (YYYY-MM-DD) the dataset was first pinned: the date a chat template's `strftime_now` gives every
    prompt of this output (gpt-oss writes `Current date:`), so a prompt renders the same on any day."""

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "lines": self.lines,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "rendered_on": self.rendered_on,
        }


def pin_dataset(path: Path, declared: DatasetFormat = "auto") -> DatasetPin:
    """The pin of the dataset as it is now, streamed (memory: 8 bytes a line)."""
    form = detect_format(path, declared)
    whole = hashlib.sha256()
    hashes: list[int] = []
    if form == "jsonl":
        with path.open("rb") as file:
            for number, line in enumerate(file):
                whole.update(line)
                if number == 0 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM) :]
                hashes.append(_jsonl_line_hash(line))
    else:
        import pyarrow.parquet as pq

        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                whole.update(block)
        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            hashes.extend(prompt_hash(normalise_parquet_row(row)) for row in batch.to_pylist())
    return DatasetPin(
        str(path), form, len(hashes), path.stat().st_size, whole.hexdigest(), np.asarray(hashes, np.uint64), today()
    )


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def render_date(output: Path) -> str:
    """The date prompts of this output render with: its pin's, or today's for an output not pinned yet."""
    pin = read_pin(output)
    return pin.rendered_on if pin is not None else today()


def prompt_hash(obj: Any) -> int:
    """The 64-bit hash of a parsed dataset line, as the pin and each record hold it."""
    return _bytes_hash(orjson.dumps(obj, default=str, option=orjson.OPT_SORT_KEYS))


def _jsonl_line_hash(line: bytes) -> int:
    stripped = line.strip()
    if not stripped:
        return 0
    try:
        return prompt_hash(orjson.loads(stripped))
    except orjson.JSONDecodeError:
        return _bytes_hash(stripped)


def _bytes_hash(data: bytes) -> int:
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def write_pin(output: Path, pin: DatasetPin) -> None:
    """Both files, each written whole then renamed into place (a crash leaves the old pin or none)."""
    output.mkdir(parents=True, exist_ok=True)
    for name, data in ((LINES_FILE, pin.line_hashes.astype("<u8").tobytes()), (PIN_FILE, orjson.dumps(pin.summary()))):
        staging = output / f".{name}.tmp"
        staging.write_bytes(data)
        os.replace(staging, output / name)


def read_pin(output: Path) -> DatasetPin | None:
    try:
        summary = orjson.loads((output / PIN_FILE).read_bytes())
        hashes = np.frombuffer((output / LINES_FILE).read_bytes(), dtype="<u8")
    except FileNotFoundError:
        return None
    return DatasetPin(
        summary["path"],
        summary["format"],
        summary["lines"],
        summary["bytes"],
        summary["sha256"],
        hashes,
        summary["rendered_on"],
    )


def pin_changes(pinned: DatasetPin, current: DatasetPin) -> str | None:
    """What changed since the pin, by line number (1-based) and id, or None when nothing did."""
    if pinned.sha256 == current.sha256 and pinned.lines == current.lines:
        return None
    common = min(pinned.lines, current.lines)
    edited = np.flatnonzero(pinned.line_hashes[:common] != current.line_hashes[:common])
    parts = []
    if len(edited):
        parts.append(f"{_lines(len(edited))} edited ({_name_lines(current, edited[:NAMED].tolist())})")
    if current.lines > pinned.lines:
        added = list(range(pinned.lines, min(current.lines, pinned.lines + NAMED)))
        parts.append(f"{_lines(current.lines - pinned.lines)} appended ({_name_lines(current, added)})")
    if current.lines < pinned.lines:
        gone = ", ".join(f"line {n + 1}" for n in range(current.lines, min(pinned.lines, current.lines + NAMED)))
        parts.append(f"{_lines(pinned.lines - current.lines)} removed from the end ({gone})")
    if not parts:
        parts.append(f"the bytes differ (sha256 {pinned.sha256[:12]} -> {current.sha256[:12]}) but no line does")
    return "; ".join(parts)


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"


def _name_lines(pin: DatasetPin, positions: list[int]) -> str:
    """`line 4 (id 'q-3')`, ids read from the current file."""
    ids = _ids_at(Path(pin.path), pin.format, set(positions))
    return ", ".join(f"line {n + 1}" + (f" (id {ids[n]!r})" if n in ids else "") for n in positions)


def _ids_at(path: Path, form: str, positions: set[int]) -> dict[int, str]:
    if form != "jsonl" or not positions:
        return {}
    found: dict[int, str] = {}
    with path.open("rb") as file:
        for n, line in enumerate(file):
            if n in positions:
                try:
                    value = orjson.loads(line).get("id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if isinstance(value, str | int):
                    found[n] = str(value)
            if len(found) == len(positions) or n > max(positions):
                break
    return found


def changed_message(dataset: Path, changes: str) -> str:
    return (
        f"spec.dataset.path {dataset} changed since this output was started: {changes}. An output must come from "
        "one dataset: restore the file it was started with, or write the changed dataset to a new spec.output.path"
    )
