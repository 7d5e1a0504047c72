"""Prompts from a JSONL or Parquet dataset, validated and assigned to shards deterministically.

Shard assignment hashes the prompt id (blake2b, not Python's salted `hash`), so every restart, pod
and machine agrees, and two lines with the same id always land in the same shard, where the second
one is set aside as a duplicate. A line without a usable id is owned by shard `line % count`, so
exactly one shard reports it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

DatasetFormat = Literal["auto", "jsonl", "parquet"]


@dataclass(frozen=True, slots=True)
class PromptRef:
    """One valid prompt of this shard. `position` is its 0-based line (row) in the dataset."""

    position: int
    id: str
    offset: int
    """Byte offset of the JSONL line (-1 for Parquet rows, which are kept in memory)."""
    length: int


@dataclass(frozen=True, slots=True)
class Prompt:
    position: int
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A dataset line set aside: the reason, and its start for a human to find it."""

    position: int
    reason: str
    excerpt: str
    id: str | None = None

    @property
    def key(self) -> str:
        return f"line:{self.position}"


class DatasetError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


def shard_of_id(prompt_id: str, shard_count: int) -> int:
    digest = hashlib.blake2b(prompt_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count


def shard_of_line(position: int, shard_count: int) -> int:
    return position % shard_count


def validate_prompt(obj: Any) -> tuple[str | None, str | None]:
    """(id, None) for a usable prompt object, else (id-if-any, reason)."""
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    raw_id = obj.get("id")
    if raw_id is None:
        return None, "missing id"
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        return None, f"id must be a string or integer, got {type(raw_id).__name__}"
    prompt_id = str(raw_id)
    if not prompt_id:
        return None, "empty id"
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return prompt_id, "empty or missing messages"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return prompt_id, f"messages[{index}] is not an object with a role"
    tools = obj.get("tools")
    if tools is not None and not isinstance(tools, list):
        return prompt_id, "tools must be a list"
    return prompt_id, None


def _excerpt(raw: bytes | str, limit: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return text[:limit]


@dataclass
class ShardPlan:
    """This shard's prompts in dataset order, plus the malformed lines it owns."""

    path: Path
    format: Literal["jsonl", "parquet"]
    shard_index: int
    shard_count: int
    prompts: list[PromptRef]
    malformed: list[MalformedLine]
    lines_total: int
    _rows: dict[int, dict[str, Any]]

    def load(self, ref: PromptRef, handle: Any = None) -> Prompt:
        """The full prompt; `handle` is an open binary file of a JSONL dataset (saves reopening)."""
        if self.format == "parquet":
            obj = self._rows[ref.position]
        elif handle is not None:
            handle.seek(ref.offset)
            obj = orjson.loads(handle.read(ref.length))
        else:
            with self.path.open("rb") as file:
                file.seek(ref.offset)
                obj = orjson.loads(file.read(ref.length))
        tools = obj.get("tools") or None
        return Prompt(ref.position, ref.id, obj["messages"], tools)

    def iter_prompts(self) -> Iterator[Prompt]:
        with self.path.open("rb") as handle:
            for ref in self.prompts:
                yield self.load(ref, handle)


def detect_format(path: Path, declared: DatasetFormat) -> Literal["jsonl", "parquet"]:
    if declared != "auto":
        return declared
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    with path.open("rb") as file:
        if file.read(4) == b"PAR1":
            return "parquet"
    return "jsonl"


class _Assigner:
    """Applies validation, duplicate detection and shard ownership line by line."""

    def __init__(self, shard_index: int, shard_count: int) -> None:
        self.shard_index = shard_index
        self.shard_count = shard_count
        self.seen: set[str] = set()
        self.prompts: list[PromptRef] = []
        self.malformed: list[MalformedLine] = []

    def take(self, position: int, obj: Any, raw: bytes | str, offset: int, length: int) -> bool:
        """Record the line if this shard owns it; True when it is a valid prompt of this shard."""
        prompt_id, reason = validate_prompt(obj)
        owner = (
            shard_of_id(prompt_id, self.shard_count)
            if prompt_id is not None
            else shard_of_line(position, self.shard_count)
        )
        if owner != self.shard_index:
            return False
        if reason is None and prompt_id in self.seen:
            reason = f"duplicate id {prompt_id!r} (first occurrence kept)"
        if reason is not None:
            self.malformed.append(MalformedLine(position, reason, _excerpt(raw), prompt_id))
            return False
        assert prompt_id is not None
        self.seen.add(prompt_id)
        self.prompts.append(PromptRef(position, prompt_id, offset, length))
        return True

    def bad_line(self, position: int, reason: str, raw: bytes | str) -> None:
        if shard_of_line(position, self.shard_count) == self.shard_index:
            self.malformed.append(MalformedLine(position, reason, _excerpt(raw)))


def plan_shard(path: str | Path, shard_index: int, shard_count: int, declared: DatasetFormat = "auto") -> ShardPlan:
    """Read the whole dataset once and keep what shard `shard_index` of `shard_count` owns."""
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise DatasetError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset {path} does not exist or is not a file")
    fmt = detect_format(path, declared)
    assigner = _Assigner(shard_index, shard_count)
    rows: dict[int, dict[str, Any]] = {}
    lines_total = _scan_jsonl(path, assigner) if fmt == "jsonl" else _scan_parquet(path, assigner, rows)
    return ShardPlan(path, fmt, shard_index, shard_count, assigner.prompts, assigner.malformed, lines_total, rows)


def _scan_jsonl(path: Path, assigner: _Assigner) -> int:
    position = 0
    offset = 0
    with path.open("rb") as file:
        for line in file:
            length = len(line)
            stripped = line.strip()
            if stripped:
                try:
                    obj = orjson.loads(stripped)
                except orjson.JSONDecodeError as error:
                    assigner.bad_line(position, f"bad JSON: {error}", stripped)
                else:
                    assigner.take(position, obj, stripped, offset, length)
            # Positions are physical 0-based line numbers (blank lines are skipped, not renumbered).
            position += 1
            offset += length
    return position


def _scan_parquet(path: Path, assigner: _Assigner, rows: dict[int, dict[str, Any]]) -> int:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:
        raise DatasetError(f"dataset {path} is not readable Parquet: {error}") from None
    position = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            obj = _normalise_parquet_row(obj)
            if assigner.take(position, obj, orjson.dumps(obj, default=str)[:200], -1, 0):
                rows[position] = obj
            position += 1
    return position


def _normalise_parquet_row(obj: dict[str, Any]) -> dict[str, Any]:
    """Parquet has no free-form JSON: messages or tools may be stored as JSON strings, structs add nulls."""
    for key in ("messages", "tools"):
        value = obj.get(key)
        if isinstance(value, str | bytes):
            with contextlib.suppress(orjson.JSONDecodeError):
                obj[key] = orjson.loads(value)
    messages = obj.get("messages")
    if isinstance(messages, list):
        obj["messages"] = [
            {k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages
        ]
    return obj
