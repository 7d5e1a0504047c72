"""The dataset pinned to its output: its size, a content hash, and a 64-bit hash per line (row), recorded by the
preflight and compared by every later reader (the workers at start and end, a resume's preflight, verify), so an
edit, a deletion or an append under a run is named by line and id instead of mixing two datasets in one output.

The pin is two files in the output directory: `dataset.pin.json` (path, format, lines, bytes, sha256) and
`dataset.lines.u64` (the line hashes, little-endian uint64, one per physical line, JSON array element or Parquet
row: 8 bytes a line).

A line's hash is `prompt_hash` of the object it parses to (keys sorted), so the worker hashes the very object
it sends and stores that hash with each record; `datagen verify` then checks every record against the pin. A line
that does not parse is hashed as its bytes; a blank line is 0. A JSON array's elements are its lines, read as the
scan reads them (`iter_json_array`); where the array breaks, the rest of the file is one more line, hashed as its
bytes.

Holding a file to its pin costs one streamed sha256 while it is unchanged (`dataset_changes`): its lines are
parsed and hashed again only to name what changed. A JSONL file can be pinned by the read that plans it
(`LinePins`, handed to a ShardScan): a worker without a pin does not read the dataset a second time first.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from datagen_operator.api.output_files import DATASET_LINE_HASHES, DATASET_PIN
from datagen_operator.api.words import plural
from datagen_operator.prompts.dataset_ref import UTF8_BOM, DatasetRef, unit_of
from datagen_operator.prompts.json_array import ArrayBreak, iter_json_array
from datagen_operator.prompts.line_shape import id_key, validate_prompt
from datagen_operator.prompts.scan import normalise_parquet_row

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
    id_field: str | None = None
    """spec.dataset.id_field, to name a changed line by its id (not stored: the pin holds content only)."""

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "lines": self.lines,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "rendered_on": self.rendered_on,
        }


def pin_dataset(dataset: DatasetRef) -> DatasetPin:
    """The pin of the dataset as it is now, streamed (memory: 8 bytes a line). Its id field names lines, and says
    whether a Parquet `id` column is the id (normalise_parquet_row)."""
    path, id_field = dataset.path, dataset.id_field
    form = dataset.read_format()
    if form == "jsonl":
        pins = LinePins(dataset, today())
        with path.open("rb") as file:
            for number, line in enumerate(file):
                if number == 0 and line.startswith(UTF8_BOM):
                    pins.update(UTF8_BOM)
                    line = line[len(UTF8_BOM) :]
                pins.line(line)
        return pins.pin()
    whole = hashlib.sha256()
    digests = bytearray()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            whole.update(block)
    if form == "json":
        with path.open("rb") as file:
            for item in iter_json_array(file, path):
                if isinstance(item, ArrayBreak):
                    digests += _rest_digest(file, item.offset)
                    break
                digests += _prompt_digest(item[2])
    else:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                digests += _prompt_digest(normalise_parquet_row(row, id_field))
    return DatasetPin(
        str(path), form, len(digests) // 8, path.stat().st_size, whole.hexdigest(), _hashes(digests), today(), id_field
    )


class LinePins:
    """A JSONL file's pin, built line by line by whoever reads it (`pin_dataset`, or a ShardScan planning it, which
    has parsed each line already): the file's sha256 and 8 bytes a line, no Python object per line.

    `update` takes every byte of the file, in order; each physical line is then one of `parsed` (the object it
    parses to), `blank` or `unparsed` (its stripped bytes), as `line` decides for a line not parsed yet. `finish`
    (the scan calls it at the end of the file) hands the pin to `on_pinned`."""

    def __init__(
        self, dataset: DatasetRef, rendered_on: str, on_pinned: Callable[[DatasetPin], None] | None = None
    ) -> None:
        self.path, self.id_field = dataset.path, dataset.id_field
        self.rendered_on, self.on_pinned = rendered_on, on_pinned
        self._whole = hashlib.sha256()
        self._digests = bytearray()
        self.update = self._whole.update

    def parsed(self, raw: bytes, obj: Any) -> None:
        self.update(raw)
        self._digests += _prompt_digest(obj)

    def blank(self, raw: bytes) -> None:
        self.update(raw)
        self._digests += _BLANK

    def unparsed(self, raw: bytes, stripped: bytes) -> None:
        self.update(raw)
        self._digests += _bytes_digest(stripped)

    def line(self, raw: bytes) -> None:
        stripped = raw.strip()
        if not stripped:
            self.blank(raw)
            return
        try:
            self.parsed(raw, orjson.loads(stripped))
        except orjson.JSONDecodeError:
            self.unparsed(raw, stripped)

    def pin(self) -> DatasetPin:
        digests = self._digests
        return DatasetPin(
            str(self.path), "jsonl", len(digests) // 8, self.path.stat().st_size, self._whole.hexdigest(),
            _hashes(digests), self.rendered_on, self.id_field,
        )  # fmt: skip

    def finish(self) -> None:
        if self.on_pinned is not None:
            self.on_pinned(self.pin())


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def render_date(output: Path) -> str:
    """The date prompts of this output render with: its pin's, or today's for an output not pinned yet."""
    pin = read_pin(output)
    return pin.rendered_on if pin is not None else today()


def prompt_hash(obj: Any) -> int:
    """The 64-bit hash of a parsed dataset line, as the pin and each record hold it."""
    return int.from_bytes(_prompt_digest(obj), "little")


def _prompt_digest(obj: Any) -> bytes:
    """prompt_hash as the pin stores it: 8 bytes, little-endian."""
    return _bytes_digest(orjson.dumps(obj, default=str, option=orjson.OPT_SORT_KEYS))


def _bytes_digest(data: bytes) -> bytes:
    return blake2b(data, digest_size=8).digest()


_BLANK = bytes(8)
"""A blank line's hash: 0."""


def _hashes(digests: bytearray) -> Any:
    """np.ndarray[uint64] over 8-byte little-endian digests (no copy: the digests are not added to after)."""
    return np.frombuffer(digests, dtype="<u8")


def _rest_digest(file: Any, offset: int) -> bytes:
    """_bytes_digest of the file from `offset` to its end, streamed (a broken JSON array's last line)."""
    digest = blake2b(digest_size=8)
    file.seek(offset)
    for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
    return digest.digest()


def write_pin(output: Path, pin: DatasetPin) -> None:
    """Both files, each written whole then renamed into place (a crash leaves the old pin or none)."""
    output.mkdir(parents=True, exist_ok=True)
    for name, data in (
        (DATASET_LINE_HASHES, pin.line_hashes.astype("<u8").tobytes()),
        (DATASET_PIN, orjson.dumps(pin.summary())),
    ):
        staging = output / f".{name}.tmp"
        staging.write_bytes(data)
        os.replace(staging, output / name)


def read_pin(output: Path) -> DatasetPin | None:
    try:
        summary = orjson.loads((output / DATASET_PIN).read_bytes())
        hashes = np.frombuffer((output / DATASET_LINE_HASHES).read_bytes(), dtype="<u8")
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


def sha256_file(path: Path) -> str:
    whole = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            whole.update(block)  # hashlib lets go of the GIL for blocks this size
    return whole.hexdigest()


def holds_pin(dataset: DatasetRef, pinned: DatasetPin) -> bool:
    """Whether the file is still the pinned one: its format, size and sha256 (one streamed read, no line parsed)."""
    path = dataset.path
    return (
        dataset.read_format() == pinned.format
        and path.stat().st_size == pinned.bytes
        and sha256_file(path) == pinned.sha256
    )


def dataset_changes(dataset: DatasetRef, pinned: DatasetPin) -> str | None:
    """What changed in the file since `pinned` (pin_changes), or None: its lines are read only when its bytes
    differ."""
    if holds_pin(dataset, pinned):
        return None
    return pin_changes(pinned, pin_dataset(dataset))


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
        gone = ", ".join(
            f"{unit_of(current.format)} {n + 1}" for n in range(current.lines, min(pinned.lines, current.lines + NAMED))
        )
        parts.append(f"{_lines(pinned.lines - current.lines)} removed from the end ({gone})")
    if not parts:
        parts.append(f"the bytes differ (sha256 {pinned.sha256[:12]} -> {current.sha256[:12]}) but no line does")
    return "; ".join(parts)


def _lines(count: int) -> str:
    return plural(count, "line")


def _name_lines(pin: DatasetPin, positions: list[int]) -> str:
    """`line 4 (id 'q-3')`, ids read from the current file."""
    ids = _ids_at(Path(pin.path), pin.format, set(positions), pin.id_field)
    return ", ".join(f"{unit_of(pin.format)} {n + 1}" + (f" (id {ids[n]!r})" if n in ids else "") for n in positions)


def _ids_at(path: Path, form: str, positions: set[int], id_field: str | None = None) -> dict[int, str]:
    if form not in ("jsonl", "json") or not positions:
        return {}
    found: dict[int, str] = {}
    last = max(positions)
    with path.open("rb") as file:
        if form == "jsonl":
            objs: Any = ((n, _parsed(line) if n in positions else None) for n, line in enumerate(file))
        else:
            objs = (
                (n, item[2]) for n, item in enumerate(iter_json_array(file, path)) if not isinstance(item, ArrayBreak)
            )
        for n, obj in objs:
            if n in positions:
                prompt_id = _named_id(obj, id_field)
                if prompt_id is not None:
                    found[n] = prompt_id
            if len(found) == len(positions) or n >= last:
                break
    return found


def _parsed(line: bytes) -> Any:
    try:
        return orjson.loads(line.removeprefix(UTF8_BOM))
    except orjson.JSONDecodeError:
        return None


def _named_id(obj: Any, id_field: str | None) -> str | None:
    """The id a person knows a line by: its id field's value (an integer as its decimal string, as the scan reads it),
    else the id derived from its content."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(id_key(id_field))
    if isinstance(value, str | int):
        return str(value)
    return validate_prompt(obj, id_field)[0] if id_key(id_field) not in obj else None


def changed_message(dataset: Path, changes: str) -> str:
    return (
        f"spec.dataset.path {dataset} changed since this output was started: {changes}. An output must come from "
        "one dataset: restore the file it was started with, or write the changed dataset to a new spec.output.path"
    )
