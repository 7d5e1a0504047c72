"""Prompts from a JSONL or Parquet dataset, validated and assigned to shards deterministically.

Shard assignment hashes the prompt id (blake2b, not Python's salted `hash`), so every restart, pod
and machine agrees, and two lines with the same id always land in the same shard, where the second
one is set aside as a duplicate. A line without a usable id is owned by shard `line % count`, so
exactly one shard reports it.

Ids are JSON strings. An integer id is refused per line (cause `bad_id`): the output keys records by a
string id (Parquet column, resume keys, rejects, verify), so a silent `str()` would make integer 1 and
string "1" the same prompt. A Parquet `id` column of an integer type is the exception: a column holds
one type, so its ids cannot collide, and they are read as their decimal strings.

A line set aside here carries a `cause` (see CAUSES) and a human reason; `check_dataset` refuses a
dataset with no valid prompt before anything is launched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, fields
from hashlib import blake2b
from pathlib import Path
from typing import Any, Literal

import orjson

DatasetFormat = Literal["auto", "jsonl", "parquet"]

# Why a dataset line is set aside (the `cause` of its rejects.jsonl entry).
BAD_JSON = "bad_json"
NOT_OBJECT = "not_object"
BAD_ID = "bad_id"
DUPLICATE_ID = "duplicate_id"
BAD_MESSAGES = "bad_messages"
INVALID_TOOLS = "invalid_tools"
CAUSES = (BAD_JSON, NOT_OBJECT, BAD_ID, DUPLICATE_ID, BAD_MESSAGES, INVALID_TOOLS)

UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


@dataclass(frozen=True, slots=True)
class PromptRef:
    """One valid prompt of this shard. `position` is its 0-based line (row) in the dataset."""

    position: int
    id: str
    offset: int
    """Byte offset of the JSONL line (-1 for Parquet rows, which are kept in memory)."""
    length: int


def _ref_slot_setters() -> tuple[Callable[[PromptRef, Any], None], ...]:
    """PromptRef's slot setters, in field order: the scan makes a PromptRef per line, and setting the slots
    directly costs a third of the frozen dataclass's __init__ (object.__setattr__ per field)."""
    names = tuple(field.name for field in fields(PromptRef))
    assert names == ("position", "id", "offset", "length"), names  # a new field must be set there too
    return tuple(getattr(PromptRef, name).__set__ for name in names)


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
    cause: str = BAD_JSON

    @property
    def key(self) -> str:
        return f"line:{self.position}"


class DatasetError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


class EmptyDataset(DatasetError):
    """The dataset has no valid prompt: a run over it would launch a server to generate nothing."""


@dataclass(frozen=True, slots=True)
class Problem:
    """Why one prompt object is unusable: a `cause` from CAUSES and a reason a person can act on."""

    cause: str
    reason: str


def shard_of_id(prompt_id: str, shard_count: int) -> int:
    # The big-endian integer of the id's 8-byte blake2b digest (UTF-8), modulo the shard count; spelled with
    # the defaults (UTF-8, big-endian), which cost less to call: every shard calls it once per dataset line.
    return int.from_bytes(blake2b(prompt_id.encode(), digest_size=8).digest()) % shard_count


def shard_of_line(position: int, shard_count: int) -> int:
    return position % shard_count


def validate_prompt(obj: Any) -> tuple[str | None, Problem | None]:
    """(id, None) for a usable prompt object, else (id-if-any, the problem)."""
    if not isinstance(obj, dict):
        return None, Problem(NOT_OBJECT, f"expected a JSON object, got {_json_type(obj)}")
    raw_id = obj.get("id")
    if raw_id is None:
        return None, Problem(BAD_ID, "missing id")
    if not isinstance(raw_id, str):
        hint = f'; write it as "id": "{raw_id}"' if isinstance(raw_id, int) and not isinstance(raw_id, bool) else ""
        return None, Problem(
            BAD_ID,
            f"id must be a JSON string, got {_json_type(raw_id)} {orjson.dumps(raw_id).decode()[:40]} "
            f'(ids are stored as strings, so integer 1 and string "1" would be one prompt){hint}',
        )
    if not raw_id:
        return None, Problem(BAD_ID, "empty id")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return raw_id, Problem(BAD_MESSAGES, "empty or missing messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return raw_id, Problem(BAD_MESSAGES, f"messages[{index}] is not an object with a role")
    tools_reason = tools_problem(obj.get("tools"))
    if tools_reason is not None:
        return raw_id, Problem(INVALID_TOOLS, tools_reason)
    return raw_id, None


def plain_prompt_id(obj: Any) -> str | None:
    """The id of a prompt of the common shape (an object with a non-empty string id, a non-empty list of
    objects each with a string role, no tools), else None: then validate_prompt must judge it. Every object
    this accepts, validate_prompt accepts with the same id (it checks a subset of the same conditions, on
    orjson's exact types), so the scan may skip validate_prompt for it (tests/worker/test_dataset_scan.py)."""
    if type(obj) is not dict:
        return None
    prompt_id = obj.get("id")
    messages = obj.get("messages")
    if type(prompt_id) is not str or not prompt_id or type(messages) is not list or not messages:
        return None
    if obj.get("tools") is not None:
        return None
    for message in messages:
        if type(message) is not dict or type(message.get("role")) is not str:
            return None
    return prompt_id


def tools_problem(tools: Any) -> str | None:
    """Why `tools` would not reach the model as SGLang's chat endpoint would send it, or None.

    The rule is SGLang's `Tool`/`Function` request models (entrypoints/openai/protocol.py): each entry
    an object with `function: {name: str, description?: str, parameters?: object, strict?: bool}`.
    Stricter than SGLang in two places, both because the chat templates and tool-call parsers only
    understand function tools with a JSON-schema object: `type` must be "function" (SGLang accepts any
    string, then renders a tool no template can declare), and `parameters`, when given, must be a schema
    of type object (`properties` an object, `required` a list of strings).
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        return f"tools must be a list, got {_json_type(tools)}"
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            return f"{where} must be an object, got {_json_type(tool)}"
        if tool.get("type") != "function":
            return f'{where}.type must be "function", got {orjson.dumps(tool.get("type")).decode()[:40]}'
        function = tool.get("function")
        if not isinstance(function, dict):
            return f"{where}.function must be an object, got {_json_type(function)}"
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            return f"{where}.function.name must be a non-empty string, got {orjson.dumps(name).decode()[:40]}"
        if function.get("description") is not None and not isinstance(function["description"], str):
            return f"{where}.function.description must be a string, got {_json_type(function['description'])}"
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            return f"{where}.function.strict must be true or false, got {_json_type(function['strict'])}"
        schema_reason = _parameters_problem(function.get("parameters"))
        if schema_reason is not None:
            return f"{where}.function.parameters {schema_reason}"
    return None


def _parameters_problem(parameters: Any) -> str | None:
    if parameters is None:
        return None  # SGLang and the templates accept a function without parameters
    if not isinstance(parameters, dict):
        return f"must be a JSON-schema object, got {_json_type(parameters)}"
    if parameters.get("type", "object") != "object":
        return f'must have "type": "object", got {orjson.dumps(parameters.get("type")).decode()[:40]}'
    if not isinstance(parameters.get("properties", {}), dict):
        return f"properties must be an object, got {_json_type(parameters['properties'])}"
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        return "required must be a list of property names"
    return None


def _json_type(value: Any) -> str:
    """The JSON name of a value's type, as a dataset author would call it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


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
    valid_lines_total: int = 0
    """Valid prompt lines in the whole dataset (every shard's, duplicates included): 0 means empty."""

    def load(self, ref: PromptRef, handle: Any = None) -> Prompt:
        """The full prompt; `handle` is an open binary file of a JSONL dataset (saves reopening)."""
        if self.format == "parquet":
            obj = self._rows[ref.position]
        elif handle is not None:
            handle.seek(ref.offset)
            obj = orjson.loads(handle.read(ref.length).strip())  # stripped as the scan parsed it
        else:
            with self.path.open("rb") as file:
                file.seek(ref.offset)
                obj = orjson.loads(file.read(ref.length).strip())
        return prompt_from(ref, obj)

    def iter_prompts(self) -> Iterator[Prompt]:
        with self.path.open("rb") as handle:
            for ref in self.prompts:
                yield self.load(ref, handle)


def prompt_from(ref: PromptRef, obj: dict[str, Any]) -> Prompt:
    """The prompt of a valid line, from its parsed object."""
    return Prompt(ref.position, ref.id, obj["messages"], obj.get("tools") or None)


def detect_format(path: Path, declared: DatasetFormat) -> Literal["jsonl", "parquet"]:
    if declared != "auto":
        return declared
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    with path.open("rb") as file:
        if file.read(4) == b"PAR1":
            return "parquet"
    return "jsonl"


class _Duplicate:
    """What take_valid returns for a later line with an id this shard already holds."""


DUPLICATE = _Duplicate()


class _Assigner:
    """Shard ownership and duplicate detection, line by line, for lines already validated.

    Duplicates are found by the ids' 64-bit hashes (a set of ints, a third of a set of id strings): two
    distinct ids share one with probability ~n^2/2^65 (3e-8 for a million ids)."""

    def __init__(self, shard_index: int, shard_count: int) -> None:
        self.shard_index = shard_index
        self.shard_count = shard_count
        self.seen: set[int] = set()
        self.take_valid = self._valid_taker()

    def _valid_taker(self) -> Callable[[int, str, int, int], PromptRef | _Duplicate | None]:
        """take_valid(position, id, offset, length): a line validate_prompt accepts, as this shard sees it:
        its PromptRef, DUPLICATE (set it aside: `duplicate`), or None (another shard's). A closure over
        locals: it runs once per valid line."""
        shard_index, shard_count = self.shard_index, self.shard_count
        seen = self.seen
        seen_add = seen.add
        new = object.__new__
        set_position, set_id, set_offset, set_length = _ref_slot_setters()

        def take_valid(position: int, prompt_id: str, offset: int, length: int) -> PromptRef | _Duplicate | None:
            # One shard owns every id: the hash would only say 0.
            if shard_count > 1 and shard_of_id(prompt_id, shard_count) != shard_index:
                return None
            before = len(seen)
            seen_add(hash(prompt_id))  # one probe of a large set, not two (`in`, then `add`)
            if len(seen) == before:
                return DUPLICATE
            ref = new(PromptRef)  # PromptRef(position, prompt_id, offset, length), see _ref_slot_setters
            set_position(ref, position)
            set_id(ref, prompt_id)
            set_offset(ref, offset)
            set_length(ref, length)
            return ref

        return take_valid

    def duplicate(self, position: int, prompt_id: str, raw: bytes | str) -> MalformedLine:
        reason = f"duplicate id {prompt_id!r} (first occurrence kept)"
        return MalformedLine(position, reason, _excerpt(raw), prompt_id, DUPLICATE_ID)

    def set_aside(
        self, position: int, prompt_id: str | None, problem: Problem, raw: bytes | str
    ) -> MalformedLine | None:
        """A line validate_prompt refuses, if this shard owns it (by its id, else by its line)."""
        owner = (
            shard_of_id(prompt_id, self.shard_count)
            if prompt_id is not None
            else shard_of_line(position, self.shard_count)
        )
        if owner != self.shard_index:
            return None
        return MalformedLine(position, problem.reason, _excerpt(raw), prompt_id, problem.cause)

    def bad_line(self, position: int, reason: str, raw: bytes | str) -> MalformedLine | None:
        if shard_of_line(position, self.shard_count) == self.shard_index:
            return MalformedLine(position, reason, _excerpt(raw), None, BAD_JSON)
        return None


class ShardScan:
    """One pass over the dataset, streamed: this shard's lines in dataset order, each a valid prompt (with
    its parsed object) or a line set aside. `lines_total` and `valid_lines_total` are known once the
    iteration is exhausted. Memory: the ids' hashes only."""

    def __init__(self, path: str | Path, shard_index: int, shard_count: int, declared: DatasetFormat = "auto") -> None:
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise DatasetError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
        self.path = Path(path)
        if not self.path.is_file():
            raise DatasetError(f"dataset {self.path} does not exist or is not a file")
        self.format = detect_format(self.path, declared)
        self.shard_index, self.shard_count = shard_index, shard_count
        self.lines_total = 0
        self.valid_lines_total = 0

    def __iter__(self) -> Iterator[tuple[PromptRef, dict[str, Any]] | MalformedLine]:
        # The reader's own generator, not one wrapped around it: a layer per line less.
        return _scan_jsonl(self) if self.format == "jsonl" else _scan_parquet(self)


def has_prompt(scan: ShardScan) -> bool:
    """Whether the dataset holds one valid prompt (any shard's): stops at the first, so a usable dataset
    costs a line or two; one without any is read whole."""
    whole = ShardScan(scan.path, 0, 1, scan.format)
    return any(not isinstance(item, MalformedLine) for item in whole)


def plan_shard(path: str | Path, shard_index: int, shard_count: int, declared: DatasetFormat = "auto") -> ShardPlan:
    """Read the whole dataset once and keep what shard `shard_index` of `shard_count` owns."""
    scan = ShardScan(path, shard_index, shard_count, declared)
    prompts: list[PromptRef] = []
    malformed: list[MalformedLine] = []
    rows: dict[int, dict[str, Any]] = {}
    for item in scan:
        if isinstance(item, MalformedLine):
            malformed.append(item)
            continue
        ref, obj = item
        prompts.append(ref)
        if scan.format == "parquet":
            rows[ref.position] = obj
    return ShardPlan(
        scan.path, scan.format, shard_index, shard_count, prompts, malformed, scan.lines_total, rows,
        valid_lines_total=scan.valid_lines_total,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """What a dataset holds, counted before anything is launched."""

    path: str
    format: str
    lines: int
    prompts: int
    """Valid prompts with a unique id: what the run will generate for."""
    set_aside: dict[str, int]
    """cause -> lines set aside (CAUSES)."""
    examples: dict[str, str]
    """cause -> the first such line's number and reason."""


def dataset_summary(path: str | Path, declared: DatasetFormat = "auto") -> DatasetSummary:
    """Count the valid prompts and the lines set aside, by cause (reads the whole dataset once, streamed:
    only the counts are kept)."""
    scan = ShardScan(path, 0, 1, declared)
    prompts = 0
    set_aside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for item in scan:
        if not isinstance(item, MalformedLine):
            prompts += 1
            continue
        set_aside[item.cause] = set_aside.get(item.cause, 0) + 1
        examples.setdefault(item.cause, f"line {item.position + 1}: {item.reason}")
    return DatasetSummary(str(scan.path), scan.format, scan.lines_total, prompts, set_aside, examples)


def check_dataset(path: str | Path, declared: DatasetFormat = "auto") -> DatasetSummary:
    """The summary of a usable dataset; EmptyDataset (naming spec.dataset.path) when it has no valid prompt,
    DatasetError when it cannot be read. For the runners to call before a server is launched."""
    summary = dataset_summary(path, declared)
    if summary.prompts == 0:
        raise EmptyDataset(empty_dataset_message(summary))
    return summary


def empty_dataset_message(summary: DatasetSummary) -> str:
    if not summary.set_aside:
        return f"spec.dataset.path {summary.path}: the dataset is empty ({summary.lines} lines, no prompt)"
    causes = "; ".join(
        f"{count} {cause} (e.g. {summary.examples[cause]})" for cause, count in sorted(summary.set_aside.items())
    )
    return f"spec.dataset.path {summary.path}: no valid prompt in {summary.lines} lines; set aside: {causes}"


def _scan_jsonl(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    """This shard's lines; sets the scan's totals once exhausted. This loop runs once per dataset line, so
    the common case takes shortcuts that change no result (tests/worker/test_dataset_scan.py): the line is
    parsed as read (JSON ignores the whitespace `strip` would cut; a line that fails is stripped and parsed
    again, for the error the stripped line gives), a prompt of the common shape skips validate_prompt
    (plain_prompt_id), and names are bound to locals."""
    path = scan.path
    assigner = _Assigner(scan.shard_index, scan.shard_count)
    take_valid, set_aside, bad_line = assigner.take_valid, assigner.set_aside, assigner.bad_line
    loads, decode_error, plain_id, validate = orjson.loads, orjson.JSONDecodeError, plain_prompt_id, validate_prompt
    position = -1
    valid = 0
    offset = 0
    with path.open("rb") as file:
        if file.read(2) in _UTF16_BOMS:
            raise DatasetError(f"dataset {path} is UTF-16 (byte order mark); JSONL must be UTF-8")
        file.seek(0)
        # Positions are physical 0-based line numbers (blank lines are skipped, not renumbered).
        for position, line in enumerate(file):
            if position == 0 and line.startswith(UTF8_BOM):
                # Editors on Windows write one; the first prompt starts after it.
                line = line[len(UTF8_BOM) :]
                offset = len(UTF8_BOM)
            start = offset
            length = len(line)
            offset += length
            try:
                obj = loads(line)
            except decode_error:
                stripped = line.strip()
                if not stripped:
                    continue
                try:
                    obj = loads(stripped)
                except decode_error as error:
                    bad = bad_line(position, f"bad JSON: {error}", stripped)
                    if bad is not None:
                        yield bad
                    continue
            prompt_id = plain_id(obj)
            if prompt_id is None:
                prompt_id, problem = validate(obj)
                if problem is not None:
                    aside = set_aside(position, prompt_id, problem, line.strip())
                    if aside is not None:
                        yield aside
                    continue
                assert prompt_id is not None
            valid += 1
            ref = take_valid(position, prompt_id, start, length)
            if type(ref) is PromptRef:
                yield ref, obj
            elif ref is DUPLICATE:
                yield assigner.duplicate(position, prompt_id, line.strip())
    scan.lines_total = position + 1
    scan.valid_lines_total = valid


def _scan_parquet(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    import pyarrow.parquet as pq

    path = scan.path
    assigner = _Assigner(scan.shard_index, scan.shard_count)

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:
        raise DatasetError(f"dataset {path} is not readable Parquet: {error}") from None
    position = 0
    valid = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            obj = normalise_parquet_row(obj)
            raw = orjson.dumps(obj, default=str)[:200]
            prompt_id, problem = validate_prompt(obj)
            if problem is not None:
                aside = assigner.set_aside(position, prompt_id, problem, raw)
                if aside is not None:
                    yield aside
            else:
                assert prompt_id is not None
                valid += 1
                ref = assigner.take_valid(position, prompt_id, -1, 0)
                if isinstance(ref, PromptRef):
                    yield ref, obj
                elif ref is DUPLICATE:
                    yield assigner.duplicate(position, prompt_id, raw)
            position += 1
    scan.lines_total = position
    scan.valid_lines_total = valid


def normalise_parquet_row(obj: dict[str, Any]) -> dict[str, Any]:
    """Parquet has no free-form JSON: messages or tools may be stored as JSON strings, structs add nulls."""
    raw_id = obj.get("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        obj["id"] = str(raw_id)  # an integer column: one type for every row, so no collision (module doc)
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
