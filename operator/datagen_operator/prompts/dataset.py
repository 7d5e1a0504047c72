"""Prompts from a JSONL, JSON array or Parquet dataset, validated and assigned to shards deterministically.

A line (a JSON array's element, a Parquet row) is a conversation: a `messages` list, or `conversations` when
`messages` is absent or null, of OpenAI messages `{role, content, ...}` (role system/user/assistant/tool; other
keys such as `reasoning_content`, `tool_calls`, `name`, `tool_call_id` are kept) or ShareGPT ones `{from, value}`
(SHAREGPT_ROLES maps `from`), and optionally `tools`. `prompt_from` hands every caller OpenAI messages: a
ShareGPT message becomes `{role, content}`. An OpenAI message's content is a string or a list of text parts
(engine/chat_content.py: a part that is not text sets the line aside as `non_text_content`); `tools` are read as
SGLang and SpecForge read them (engine/chat_tools.py: a JSON string, bare function objects, type names).

Shard assignment hashes the prompt id (blake2b, not Python's salted `hash`), so every restart, pod
and machine agrees, and two lines with the same id always land in the same shard, where the second
one is set aside as a duplicate. A line without a usable id is owned by shard `line % count`, so
exactly one shard reports it.

Ids live in the id field (`id`, or spec.dataset.id_field). A line that has the field holds its id there, as
a JSON string or an integer (SpecForge's own test data numbers its lines), read as its decimal string: the
output keys records by a string id (Parquet column, resume keys, rejects, verify). Integer 1 and string "1" are
then one id; where one dataset holds both, the later line is set aside as `duplicate_id` with a reason naming
the collision (`_Assigner.duplicate`), as any repeated id is. Other ids (a number with a fraction, a boolean,
an object) are refused per line (cause `bad_id`).

A line WITHOUT the id field gets an id derived from its content (`derived_id`): "sha256:" and the first 16 hex
digits of the SHA-256 of `orjson.dumps({"messages": <its normalised messages>, "tools": <its tools or null>},
OPT_SORT_KEYS)`. It depends on nothing but the conversation, so it survives reordering the file, and two equal
conversations are one prompt: the second is set aside as `duplicate_id`.

A line set aside here carries a `cause` (see CAUSES: the first of its problems) and a human reason naming
every problem it has, joined by "; ". In a reason, a number after a word counts from 1 ("line 12",
"message 3", "element 4"); an index in brackets is JSON's, from 0 ("messages[2]", "tools[0]"), and so is a
byte offset. `check_dataset` refuses a dataset with no valid prompt, or one mostly of a shape this reader does
not know, before anything is launched.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, fields
from hashlib import blake2b, sha256
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

import orjson

from datagen_operator.api.progress import DUPLICATE_ID as DUPLICATE_ID
from datagen_operator.api.words import agrees, plural  # the checks count it apart
from datagen_operator.engine.chat_content import NON_TEXT_CONTENT, content_problem
from datagen_operator.engine.chat_tools import json_type as _json_type
from datagen_operator.engine.chat_tools import read_tools

if TYPE_CHECKING:  # the spec models load pydantic: a scan without a sample or mix needs none of it
    from datagen_operator.api.spec import DatasetSample
    from datagen_operator.prompts.draws import SubsetRule, VariableDraws

DatasetFormat = Literal["auto", "jsonl", "json", "parquet"]
ReadFormat = Literal["jsonl", "json", "parquet"]

# Why a dataset line is set aside (the `cause` of its rejects.jsonl entry).
BAD_JSON = "bad_json"
NOT_OBJECT = "not_object"
BAD_ID = "bad_id"
BAD_MESSAGES = "bad_messages"
INVALID_TOOLS = "invalid_tools"
UNKNOWN_SHAPE = "unknown_shape"
"""Not a conversation this reader knows: no messages/conversations list, or a message neither OpenAI nor ShareGPT."""
INVALID_TEMPLATE_KWARGS = "invalid_template_kwargs"
CAUSES = (
    BAD_JSON,
    NOT_OBJECT,
    BAD_ID,
    DUPLICATE_ID,
    BAD_MESSAGES,
    NON_TEXT_CONTENT,
    INVALID_TOOLS,
    UNKNOWN_SHAPE,
    INVALID_TEMPLATE_KWARGS,
)

TEMPLATE_KWARGS = "chat_template_kwargs"
"""A line's own chat-template variables (SGLang's chat request field of the same name), e.g. gpt-oss's
`reasoning_effort` or Qwen3's `enable_thinking` per line: rendered over the run's variables."""


UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""`developer`: the OpenAI role gpt-oss's harmony template renders as its developer message."""
SHAREGPT_ROLES: dict[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
    "function_call": "assistant",  # the call's text is the assistant's turn (its value kept as content)
}
"""ShareGPT `from` -> OpenAI role."""
EXPECTED_SHAPES = "expected system/developer/user/assistant/tool (OpenAI {role, content}) or ShareGPT {from: human|gpt|system|tool, value}"
MESSAGE_PROBLEMS_NAMED = 3
"""Bad messages of one line named in its reason; the rest are counted."""
JSON_CHUNK_SIZE = 1 << 20
"""Bytes read at a time from a JSON array file (a module global, so a test can make elements span reads)."""


@dataclass(frozen=True, slots=True)
class PromptRef:
    """One valid prompt of this shard. `position` is its 0-based line (row, JSON array element) in the dataset."""

    position: int
    id: str
    offset: int
    """Byte offset of the JSONL line or JSON array element (-1 for Parquet rows, which are kept in memory)."""
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
    """OpenAI messages, whichever shape the line had (normalised_messages)."""
    tools: list[dict[str, Any]] | None
    variables: dict[str, Any] | None = None
    """The line's chat_template_kwargs, rendered over the run's template variables."""
    source_fields: str | None = None
    """The line's other fields as JSON text (`source_fields`), where the worker read them: carried to its records."""


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
        return line_key(self.position)


def line_number(position: int) -> int:
    """A dataset line (or JSON array element) as a person counts it: 1-based, in every message, record and
    rejects.jsonl entry (`position` stays the 0-based index inside the program)."""
    return position + 1


def line_key(position: int) -> str:
    """The rejects.jsonl key of a dataset line set aside."""
    return f"line:{line_number(position)}"


class DatasetError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


class EmptyDataset(DatasetError):
    """The dataset has no valid prompt: a run over it would launch a server to generate nothing."""


class UnknownDatasetShape(DatasetError):
    """Most of the dataset's lines are of a shape this reader does not know: another kind of dataset."""


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


def validate_prompt(obj: Any, id_field: str | None = None) -> tuple[str | None, Problem | None]:
    """(id, None) for a usable prompt object, else (id-if-any, the problem: every one the line has, in one
    reason). The id is the id field's (`id_field`, default `id`; an integer as its decimal string), else
    derived from the content (module doc)."""
    if not isinstance(obj, dict):
        return None, Problem(NOT_OBJECT, f"expected a JSON object, got {_json_type(obj)}")
    id_key = id_field or "id"
    problems: list[Problem] = []
    prompt_id: str | None = None
    if id_key in obj:
        prompt_id, id_problem = _id_problem(obj[id_key], id_key)
        if id_problem is not None:
            problems.append(id_problem)
    messages: list[dict[str, Any]] | None = None
    key = _messages_key(obj)
    if key is not None:
        messages, message_problems = _judge_messages(obj[key], key)
        problems += message_problems
    else:
        other = [name for name in obj if name != id_key]
        if other:
            shown = ", ".join(repr(name) for name in other[:5]) + (
                f" and {len(other) - 5} more" if len(other) > 5 else ""
            )
            problems.append(
                Problem(
                    UNKNOWN_SHAPE,
                    f"no messages or conversations: the object has keys {shown}; expected a `messages` or "
                    "`conversations` list of OpenAI {role, content} or ShareGPT {from, value} messages",
                )
            )
        else:
            problems.append(Problem(BAD_MESSAGES, "empty or missing messages"))
    tools = obj.get("tools")
    tools_reason = tools_problem(tools)
    if tools_reason is not None:
        problems.append(Problem(INVALID_TOOLS, tools_reason))
    kwargs = obj.get(TEMPLATE_KWARGS)
    kwargs_reason = template_kwargs_problem(kwargs)
    if kwargs_reason is not None:
        problems.append(Problem(INVALID_TEMPLATE_KWARGS, kwargs_reason))
    if problems:
        return prompt_id, Problem(problems[0].cause, "; ".join(problem.reason for problem in problems))
    if id_key not in obj:
        assert messages is not None
        prompt_id = derived_id(messages, tools, kwargs)
    return prompt_id, None


def template_kwargs_problem(kwargs: Any) -> str | None:
    """Why a line's chat_template_kwargs cannot be rendered over the run's variables, or None."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        return f"{TEMPLATE_KWARGS} must be an object of template variables, got {_json_type(kwargs)}"
    from datagen_operator.api.resolve import RESERVED_VARIABLES  # only for lines that have their own

    reserved = sorted(RESERVED_VARIABLES & kwargs.keys())
    if reserved:
        return f"{TEMPLATE_KWARGS} may not set {', '.join(reserved)}: the renderer gives the template those itself"
    return None


def _id_problem(raw_id: Any, id_key: str) -> tuple[str | None, Problem | None]:
    """The id held in the id field (an integer as its decimal string), or why it is unusable."""
    if raw_id is None:
        return None, Problem(BAD_ID, f"missing {id_key}")
    if type(raw_id) is int:
        return str(raw_id), None  # "1" and 1 in one dataset: the later is a duplicate, named (_Assigner.duplicate)
    if not isinstance(raw_id, str):
        return None, Problem(
            BAD_ID,
            f"{id_key} must be a JSON string or an integer, got {_json_type(raw_id)} "
            f"{orjson.dumps(raw_id).decode()[:40]}",
        )
    if not raw_id:
        return None, Problem(BAD_ID, f"empty {id_key}")
    return raw_id, None


def _messages_key(obj: dict[str, Any]) -> str | None:
    """Which key holds the conversation: `messages`, else `conversations` (ShareGPT dumps), else None (neither)."""
    for key in ("messages", "conversations"):
        if obj.get(key) is not None:
            return key
    for key in ("messages", "conversations"):
        if key in obj:
            return key  # null: judged as empty
    return None


def _judge_messages(messages: Any, key: str) -> tuple[list[dict[str, Any]] | None, list[Problem]]:
    """(the messages as OpenAI messages, no problem), or (None, every bad message's problem)."""
    if not isinstance(messages, list) or not messages:
        return None, [Problem(BAD_MESSAGES, f"empty or missing {key}")]
    out: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for index, message in enumerate(messages):
        where = f"message {index + 1} ({key}[{index}])"
        if not isinstance(message, dict):
            problems.append(Problem(BAD_MESSAGES, f"{where} is not an object, got {_json_type(message)}"))
        elif "role" in message:
            role = message["role"]
            if isinstance(role, str) and role in OPENAI_ROLES:
                content = content_problem(message, where)
                if content is None:
                    out.append(message)
                else:
                    non_text, reason = content
                    problems.append(Problem(NON_TEXT_CONTENT if non_text else BAD_MESSAGES, reason))
            else:
                problems.append(Problem(UNKNOWN_SHAPE, f"{where} has role {_shown(role)}; {EXPECTED_SHAPES}"))
        elif "from" in message:
            speaker = message["from"]
            mapped = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
            if mapped is None:
                problems.append(Problem(UNKNOWN_SHAPE, f"{where} has from {_shown(speaker)}; {EXPECTED_SHAPES}"))
            elif "value" not in message:
                problems.append(Problem(UNKNOWN_SHAPE, f"{where} has from but no value; {EXPECTED_SHAPES}"))
            elif not isinstance(message["value"], str):
                problems.append(
                    Problem(BAD_MESSAGES, f"{where} value must be a string, got {_json_type(message['value'])}")
                )
            else:
                out.append({"role": mapped, "content": message["value"]})
        else:
            names = ", ".join(repr(name) for name in list(message)[:5])
            found = f"keys {names}" if names else "no keys"
            problems.append(Problem(UNKNOWN_SHAPE, f"{where} has {found}; {EXPECTED_SHAPES}"))
    if len(problems) > MESSAGE_PROBLEMS_NAMED:
        more = len(problems) - MESSAGE_PROBLEMS_NAMED
        problems[MESSAGE_PROBLEMS_NAMED:] = [Problem(problems[0].cause, f"and {more} more bad messages")]
    return (None, problems) if problems else (out, [])


def normalised_messages(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A valid line's messages as OpenAI messages: OpenAI ones as they are (the same dicts: their other keys
    kept), ShareGPT ones as `{role, content}`; the line's own list when every message is OpenAI already."""
    messages: list[dict[str, Any]] = obj.get("messages") or obj["conversations"]
    for message in messages:
        if "role" not in message:
            return [
                message if "role" in message else {"role": SHAREGPT_ROLES[message["from"]], "content": message["value"]}
                for message in messages
            ]
    return messages


def derived_id(messages: list[dict[str, Any]], tools: Any, kwargs: Any = None) -> str:
    """The id of a line without an id field (module doc): its normalised messages and its tools (absent, null
    and [] alike, as the prompt sent is the same), keys sorted; its chat_template_kwargs when it has some (the
    same chat with thinking on and off is two prompts)."""
    content: dict[str, Any] = {"messages": messages, "tools": tools or None}
    if kwargs:
        content[TEMPLATE_KWARGS] = kwargs
    body = orjson.dumps(content, default=str, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + sha256(body).hexdigest()[:16]


def plain_prompt_id(obj: Any, id_key: str = "id") -> str | None:
    """The id of a prompt of the common shape (an object with a non-empty string id, a non-empty `messages`
    list of objects each with an OpenAI role and string content, or none outside a user message; no tools), else
    None: then validate_prompt must judge it. Every object this accepts, validate_prompt accepts with the same id
    (it checks a subset of the same conditions, on orjson's exact types), so the scan may skip validate_prompt
    for it (tests/worker/test_dataset_scan.py)."""
    if type(obj) is not dict:
        return None
    prompt_id = obj.get(id_key)
    messages = obj.get("messages")
    if type(prompt_id) is not str or not prompt_id or type(messages) is not list or not messages:
        return None
    if obj.get("tools") is not None or obj.get(TEMPLATE_KWARGS) is not None:
        return None
    roles = OPENAI_ROLES
    try:
        for message in messages:
            if type(message) is not dict:
                return None
            role = message.get("role")
            if role not in roles:
                return None
            # Content parts, and a user message without content, are judged in full (engine/chat_content.py).
            content = message.get("content")
            if type(content) is not str and (content is not None or role == "user"):
                return None
    except TypeError:  # an unhashable role (a list, an object): validate_prompt names it
        return None
    return prompt_id


def _shown(value: Any) -> str:
    """A value found in a line, short, as a person would recognise it ('narrator', 1, null)."""
    if isinstance(value, str):
        return repr(value[:40])
    return orjson.dumps(value, default=str).decode()[:40]


def tools_problem(tools: Any) -> str | None:
    """Why a line's `tools` would not reach the model as SGLang's chat endpoint would send them, or None
    (engine/chat_tools.py `read_tools`, which reads them)."""
    return read_tools(tools)[1]


def _excerpt(raw: bytes | str, limit: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return text[:limit]


@dataclass
class ShardPlan:
    """This shard's prompts in dataset order, plus the malformed lines it owns."""

    path: Path
    format: ReadFormat
    shard_index: int
    shard_count: int
    prompts: list[PromptRef]
    malformed: list[MalformedLine]
    lines_total: int
    _rows: dict[int, dict[str, Any]]
    valid_lines_total: int = 0
    """Valid prompt lines in the whole dataset (every shard's, duplicates included): 0 means empty."""
    draws: VariableDraws | None = None
    """generation.templateVariableMix (prompt_from)."""

    def load(self, ref: PromptRef, handle: Any = None) -> Prompt:
        """The full prompt; `handle` is an open binary file of a JSONL or JSON dataset (saves reopening)."""
        if self.format == "parquet":
            obj = self._rows[ref.position]
        elif handle is not None:
            handle.seek(ref.offset)
            obj = orjson.loads(handle.read(ref.length).strip())  # stripped as the scan parsed it
        else:
            with self.path.open("rb") as file:
                file.seek(ref.offset)
                obj = orjson.loads(file.read(ref.length).strip())
        return prompt_from(ref, obj, self.draws)

    def iter_prompts(self) -> Iterator[Prompt]:
        with self.path.open("rb") as handle:
            for ref in self.prompts:
                yield self.load(ref, handle)


def prompt_from(ref: PromptRef, obj: dict[str, Any], draws: VariableDraws | None = None) -> Prompt:
    """The prompt of a valid line, from its parsed object: its messages as OpenAI messages (normalised_messages).
    `draws`: generation.templateVariableMix: the line's drawn variables are its chat_template_kwargs, under its
    own (a line's own value of a drawn variable wins)."""
    return Prompt(
        ref.position,
        ref.id,
        normalised_messages(obj),
        read_tools(obj.get("tools"))[0],
        line_variables(ref.id, obj, draws),
    )


def line_variables(prompt_id: str, obj: dict[str, Any], draws: VariableDraws | None) -> dict[str, Any] | None:
    """The chat_template_kwargs a line renders with: its drawn variables (prompts/draws.py), then its own."""
    own = obj.get(TEMPLATE_KWARGS) or None
    if draws is None:
        return own
    return {**draws.draw(prompt_id), **(own or {})}


CONVERSATION_KEYS = ("messages", "conversations", "tools")
"""What a line's conversation is read from; every other top-level key but its id is one of its `source_fields`."""


def source_fields(obj: dict[str, Any], id_field: str | None = None, drawn: dict[str, Any] | None = None) -> str | None:
    """A line's fields beside its conversation (metadata, source, category, its chat_template_kwargs...) as JSON
    text, keys in the line's order, or None when it has none: what a record carries of its line so every export
    keeps the row, as SpecForge's regeneration keeps its input row. Its id (`id_field`, default `id`) is the
    record's own; messages/conversations and tools are the prompt. A null value is kept (a Parquet column's).
    `drawn`: with generation.templateVariableMix, the chat_template_kwargs the line rendered with (line_variables:
    its draw under its own), recorded as its chat_template_kwargs, so each record says what it was drawn."""
    skipped = (*CONVERSATION_KEYS, id_field or "id")
    fields = {key: value for key, value in obj.items() if key not in skipped}
    if drawn is not None:
        fields[TEMPLATE_KWARGS] = drawn
    return orjson.dumps(fields, default=str).decode() if fields else None


def unit_of(form: str) -> str:
    """What a position counts in a dataset of this format, for a person: a JSON array's elements are not lines."""
    return "element" if form == "json" else "line"


def detect_format(path: Path, declared: DatasetFormat) -> ReadFormat:
    if declared != "auto":
        return declared
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    with path.open("rb") as file:
        head = file.read(4)
        if head == b"PAR1":
            return "parquet"
        file.seek(len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0)
        return "json" if _starts_json_array(file) else "jsonl"


_FIRST_LINE_LIMIT = 1 << 20


def _starts_json_array(file: IO[bytes]) -> bool:
    """Whether the text from here is one JSON array rather than JSONL: its first non-whitespace byte is `[`,
    unless the first line is a whole JSON value with more lines after it (JSONL whose first line is an array,
    which an older reader took as JSONL: a line set aside, not the whole file misread)."""
    while True:
        block = file.read(1 << 16)
        if not block:
            return False
        start = len(block) - len(block.lstrip(_JSON_WS))
        if start < len(block):
            break
    if block[start] != ord("["):
        return False
    line = block[start:].split(b"\n", 1)[0]
    while len(line) < _FIRST_LINE_LIMIT and len(line) == len(block) - start:
        more = file.read(1 << 16)  # the first line continues past this block
        if not more:
            return True  # the whole file is that one line: one array
        block += more
        line = block[start:].split(b"\n", 1)[0]
    if len(line) >= _FIRST_LINE_LIMIT:
        return True  # a JSONL line this long that is an array is no dataset; an array file is
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return True  # `[`, or `[{...},`: a line of a multi-line array
    rest = block[start + len(line) :]
    while not rest.strip(_JSON_WS):
        rest = file.read(1 << 16)
        if not rest:
            return True  # `[...]` alone: an array
    return False


class _Duplicate:
    """What take_valid returns for a later line with an id this shard already holds."""


DUPLICATE = _Duplicate()


class _Assigner:
    """Shard ownership and duplicate detection, line by line, for lines already validated.

    Duplicates are found by the ids' 64-bit hashes (prompts/seen.py, about 10 bytes an id): two distinct ids
    share one with probability ~n^2/2^65 (3e-8 for a million ids)."""

    def __init__(self, shard_index: int, shard_count: int) -> None:
        self.shard_index = shard_index
        self.shard_count = shard_count
        from datagen_operator.prompts.seen import SeenHashes  # numpy: only once a dataset is read

        self.seen = SeenHashes()
        self.integer_ids = SeenHashes()
        """The ids taken that a line held as an integer (few datasets have any), to name a collision of 1 and "1"."""
        self.take_valid = self._valid_taker()

    def _valid_taker(self) -> Callable[[int, str, int, int], PromptRef | _Duplicate | None]:
        """take_valid(position, id, offset, length): a line validate_prompt accepts, as this shard sees it:
        its PromptRef, DUPLICATE (set it aside: `duplicate`), or None (another shard's). A closure over
        locals: it runs once per valid line."""
        shard_index, shard_count = self.shard_index, self.shard_count
        first_time = self.seen.add
        new = object.__new__
        set_position, set_id, set_offset, set_length = _ref_slot_setters()

        def take_valid(position: int, prompt_id: str, offset: int, length: int) -> PromptRef | _Duplicate | None:
            # One shard owns every id: the hash would only say 0.
            if shard_count > 1 and shard_of_id(prompt_id, shard_count) != shard_index:
                return None
            if not first_time(hash(prompt_id)):
                return DUPLICATE
            ref = new(PromptRef)  # PromptRef(position, prompt_id, offset, length), see _ref_slot_setters
            set_position(ref, position)
            set_id(ref, prompt_id)
            set_offset(ref, offset)
            set_length(ref, length)
            return ref

        return take_valid

    def took_integer(self, prompt_id: str) -> None:
        """The line just taken held its id as an integer."""
        self.integer_ids.add(hash(prompt_id))

    def duplicate(self, position: int, prompt_id: str, raw: bytes | str, integer: bool = False) -> MalformedLine:
        """A later line with an id already taken; `integer`: this line holds it as an integer."""
        if integer != (hash(prompt_id) in self.integer_ids):
            first, this = ("string", "integer") if integer else ("integer", "string")
            reason = (
                f"id {prompt_id!r} collides: an earlier line holds it as the {first} and this one as the {this}, and "
                "ids are stored as strings, so they would be one prompt (first occurrence kept); give one of them "
                "another id"
            )
        else:
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


class LineSink(Protocol):
    """What a JSONL scan tells about every physical line it reads, as it reads it (prompts/pin.py's LinePins:
    the dataset pinned by the read that plans it)."""

    def update(self, data: bytes, /) -> None:
        """Bytes of the file not in the line handed over next (the byte order mark)."""

    def parsed(self, raw: bytes, obj: Any) -> None: ...

    def blank(self, raw: bytes) -> None: ...

    def unparsed(self, raw: bytes, stripped: bytes) -> None: ...

    def finish(self) -> None:
        """The end of the file: every line was handed over."""


class ShardScan:
    """One pass over the dataset, streamed: this shard's lines in dataset order, each a valid prompt (with
    its parsed object) or a line set aside. `lines_total` and `valid_lines_total` are known once the
    iteration is exhausted. Memory: the ids' hashes only. `id_field`: spec.dataset.id_field (None: `id`).
    `lines`: a JSONL scan hands it every line it reads, every shard's (set before iterating). `sample`:
    spec.dataset.sample: only the subset's lines are yielded and counted as valid (prompts/draws.py), while
    `lines` and `lines_total` still see every line (the pin is the whole dataset's)."""

    def __init__(
        self,
        path: str | Path,
        shard_index: int,
        shard_count: int,
        declared: DatasetFormat = "auto",
        *,
        id_field: str | None = None,
        sample: DatasetSample | None = None,
    ) -> None:
        if shard_count < 1 or not 0 <= shard_index < shard_count:
            raise DatasetError(f"shard index {shard_index} is outside 0..{shard_count - 1}")
        self.path = Path(path)
        if not self.path.is_file():
            raise DatasetError(f"dataset {self.path} does not exist or is not a file")
        self.format = detect_format(self.path, declared)
        self.shard_index, self.shard_count = shard_index, shard_count
        self.id_field = id_field
        self.lines_total = 0
        self.valid_lines_total = 0
        self.lines: LineSink | None = None
        self.sample = sample
        self.subset: SubsetRule | None = None
        """The sample's rule over this file, once a scan started (a count's needs a pass of its own)."""

    def keeps(self) -> Callable[[str], bool] | None:
        """Whether a line of this identity (prompt id, else line key) is in the subset; None: every line is."""
        if self.sample is None:
            return None
        if self.subset is None:
            self.subset = _subset_rule(self.sample, self.path, self.format, self.id_field)
        return self.subset.keeps

    def __iter__(self) -> Iterator[tuple[PromptRef, dict[str, Any]] | MalformedLine]:
        # The reader's own generator, not one wrapped around it: a layer per line less.
        if self.format == "jsonl":
            return _scan_jsonl(self)
        return _scan_json(self) if self.format == "json" else _scan_parquet(self)


_counted: dict[tuple[Any, ...], SubsetRule] = {}
"""Count rules by dataset file state and sample: one process reads a dataset to count it once."""


def _subset_rule(sample: DatasetSample, path: Path, form: ReadFormat, id_field: str | None) -> SubsetRule:
    """The rule of `sample` over the dataset at `path`. A fraction's needs no read; a count's, one pass over the
    whole dataset (its valid prompts' ids), remembered while the file is unchanged."""
    from datagen_operator.prompts.draws import count_rule, fraction_rule

    if sample.fraction is not None:
        return fraction_rule(sample)
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, form, id_field, sample.count, sample.seed)
    rule = _counted.get(key)
    if rule is None:
        whole = ShardScan(path, 0, 1, form, id_field=id_field)  # duplicates come as MalformedLine: one id each
        rule = count_rule(sample, (item[0].id for item in whole if not isinstance(item, MalformedLine)))
        _counted[key] = rule
    return rule


def has_prompt(scan: ShardScan) -> bool:
    """Whether the dataset holds one valid prompt (any shard's), read with the scan's format and id field:
    stops at the first, so a usable dataset costs a line or two; one without any is read whole."""
    whole = ShardScan(scan.path, 0, 1, scan.format, id_field=scan.id_field, sample=scan.sample)
    return any(not isinstance(item, MalformedLine) for item in whole)


def plan_shard(
    path: str | Path,
    shard_index: int,
    shard_count: int,
    declared: DatasetFormat = "auto",
    *,
    id_field: str | None = None,
    sample: DatasetSample | None = None,
    draws: VariableDraws | None = None,
) -> ShardPlan:
    """Read the whole dataset once and keep what shard `shard_index` of `shard_count` owns (of the subset, with a
    `sample`)."""
    scan = ShardScan(path, shard_index, shard_count, declared, id_field=id_field, sample=sample)
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
        valid_lines_total=scan.valid_lines_total, draws=draws,
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

    @property
    def non_blank(self) -> int:
        """Lines that hold something: the valid prompts and every line set aside (duplicates included)."""
        return self.prompts + sum(self.set_aside.values())


def dataset_summary(
    path: str | Path, declared: DatasetFormat = "auto", *, id_field: str | None = None
) -> DatasetSummary:
    """Count the valid prompts and the lines set aside, by cause (reads the whole dataset once, streamed:
    only the counts are kept)."""
    scan = ShardScan(path, 0, 1, declared, id_field=id_field)
    unit = unit_of(scan.format)
    prompts = 0
    set_aside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for item in scan:
        if not isinstance(item, MalformedLine):
            prompts += 1
            continue
        set_aside[item.cause] = set_aside.get(item.cause, 0) + 1
        examples.setdefault(item.cause, f"{unit} {item.position + 1}: {item.reason}")
    return DatasetSummary(str(scan.path), scan.format, scan.lines_total, prompts, set_aside, examples)


def check_dataset(path: str | Path, declared: DatasetFormat = "auto", *, id_field: str | None = None) -> DatasetSummary:
    """The summary of a usable dataset; EmptyDataset (naming spec.dataset.path) when it has no valid prompt,
    UnknownDatasetShape when more than half its non-blank lines are of an unknown shape (a dataset of another
    kind, whose few lines that happen to parse as chats would be a run over the wrong data), DatasetError when
    it cannot be read. For the runners to call before a server is launched."""
    return _usable(dataset_summary(path, declared, id_field=id_field))


def check_plan(plan: ShardPlan) -> DatasetSummary:
    """check_dataset over a plan of the whole dataset (shard 0 of 1) already read: no second pass."""
    if plan.shard_count != 1:
        raise ValueError("check_plan needs the plan of the whole dataset (shard 0 of 1)")
    return _lines_usable(plan.path, plan.format, plan.lines_total, len(plan.prompts), plan.malformed)


def check_lines(scan: ShardScan, prompts: int, malformed: list[MalformedLine]) -> DatasetSummary:
    """check_dataset over a scan of the whole dataset (shard 0 of 1) already iterated: its valid prompts counted,
    its lines set aside kept."""
    if scan.shard_count != 1:
        raise ValueError("check_lines needs a scan of the whole dataset (shard 0 of 1)")
    if scan.subset is not None and prompts == 0 and not malformed:
        raise EmptyDataset(
            f"spec.dataset.path {scan.path}: spec.dataset.sample keeps no line of its {scan.lines_total} "
            f"({scan.subset.said()}): raise spec.dataset.sample.fraction, or set a count"
        )
    return _lines_usable(scan.path, scan.format, scan.lines_total, prompts, malformed)


def _lines_usable(path: Path, form: str, lines: int, prompts: int, malformed: list[MalformedLine]) -> DatasetSummary:
    unit = unit_of(form)
    set_aside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for line in malformed:
        set_aside[line.cause] = set_aside.get(line.cause, 0) + 1
        examples.setdefault(line.cause, f"{unit} {line.position + 1}: {line.reason}")
    return _usable(DatasetSummary(str(path), form, lines, prompts, set_aside, examples))


def _usable(summary: DatasetSummary) -> DatasetSummary:
    if summary.prompts == 0:
        raise EmptyDataset(empty_dataset_message(summary))
    unknown = summary.set_aside.get(UNKNOWN_SHAPE, 0)
    if 2 * unknown > summary.non_blank:
        raise UnknownDatasetShape(
            f"spec.dataset.path {summary.path}: {unknown} of {plural(summary.non_blank, unit_of(summary.format))} "
            f"{agrees(unknown, 'is', 'are')} of "
            f"an unknown shape (e.g. {summary.examples[UNKNOWN_SHAPE]}); this is not a chat dataset this reader "
            "knows: convert it, or point spec.dataset.path at the right file"
        )
    return summary


def empty_dataset_message(summary: DatasetSummary) -> str:
    lines = plural(summary.lines, unit_of(summary.format))
    if not summary.set_aside:
        return f"spec.dataset.path {summary.path}: the dataset is empty ({lines}, no prompt)"
    causes = "; ".join(
        f"{count} {cause} (e.g. {summary.examples[cause]})" for cause, count in sorted(summary.set_aside.items())
    )
    return f"spec.dataset.path {summary.path}: no valid prompt in {lines}; set aside: {causes}"


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
    id_field = scan.id_field
    id_key = id_field or "id"
    sink = scan.lines
    keep = scan.keeps()
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
                if sink is not None:
                    sink.update(UTF8_BOM)
            start = offset
            length = len(line)
            offset += length
            try:
                obj = loads(line)
            except decode_error:
                stripped = line.strip()
                if not stripped:
                    if sink is not None:
                        sink.blank(line)
                    continue
                try:
                    obj = loads(stripped)
                except decode_error as error:
                    if sink is not None:
                        sink.unparsed(line, stripped)
                    if keep is not None and not keep(line_key(position)):
                        continue
                    bad = bad_line(position, f"bad JSON: {error}", stripped)
                    if bad is not None:
                        yield bad
                    continue
            if sink is not None:
                sink.parsed(line, obj)
            prompt_id = plain_id(obj, id_key)
            integer = False
            if prompt_id is None:
                prompt_id, problem = validate(obj, id_field)
                if problem is not None:
                    if keep is not None and not keep(prompt_id or line_key(position)):
                        continue
                    aside = set_aside(position, prompt_id, problem, line.strip())
                    if aside is not None:
                        yield aside
                    continue
                assert prompt_id is not None
                integer = type(obj.get(id_key)) is int
            if keep is not None and not keep(prompt_id):
                continue
            valid += 1
            ref = take_valid(position, prompt_id, start, length)
            if type(ref) is PromptRef:
                if integer:
                    assigner.took_integer(prompt_id)
                yield ref, obj
            elif ref is DUPLICATE:
                yield assigner.duplicate(position, prompt_id, line.strip(), integer)
    scan.lines_total = position + 1
    scan.valid_lines_total = valid
    if sink is not None:
        sink.finish()


def _scan_json(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    """A JSON array's elements as lines (position: the element's 0-based index; offset and length: its bytes),
    streamed (iter_json_array); where the array breaks, the rest is one more line, set aside as bad_json."""
    assigner = _Assigner(scan.shard_index, scan.shard_count)
    id_field = scan.id_field
    id_key = id_field or "id"
    keep = scan.keeps()
    position = 0
    valid = 0
    with scan.path.open("rb") as file:
        for item in iter_json_array(file, scan.path):
            if isinstance(item, ArrayBreak):
                bad = assigner.bad_line(position, item.reason, item.excerpt)
                if bad is not None and (keep is None or keep(line_key(position))):
                    yield bad
                position += 1
                break
            offset, data, obj = item
            prompt_id = plain_prompt_id(obj, id_key)
            problem = None
            if prompt_id is None:
                prompt_id, problem = validate_prompt(obj, id_field)
            if keep is not None and not keep(prompt_id or line_key(position)):
                pass
            elif problem is not None:
                aside = assigner.set_aside(position, prompt_id, problem, data[:200])
                if aside is not None:
                    yield aside
            else:
                assert prompt_id is not None
                valid += 1
                integer = type(obj.get(id_key)) is int
                ref = assigner.take_valid(position, prompt_id, offset, len(data))
                if isinstance(ref, PromptRef):
                    if integer:
                        assigner.took_integer(prompt_id)
                    yield ref, obj
                elif ref is DUPLICATE:
                    yield assigner.duplicate(position, prompt_id, data[:200], integer)
            position += 1
    scan.lines_total = position
    scan.valid_lines_total = valid


def _scan_parquet(scan: ShardScan) -> Generator[tuple[PromptRef, dict[str, Any]] | MalformedLine, None, None]:
    import pyarrow.parquet as pq

    path = scan.path
    assigner = _Assigner(scan.shard_index, scan.shard_count)
    id_field = scan.id_field

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:
        raise DatasetError(f"dataset {path} is not readable Parquet: {error}") from None
    keep = scan.keeps()
    position = 0
    valid = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            obj = normalise_parquet_row(obj, id_field)
            raw = orjson.dumps(obj, default=str)[:200]
            prompt_id, problem = validate_prompt(obj, id_field)
            if keep is not None and not keep(prompt_id or line_key(position)):
                pass
            elif problem is not None:
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


def normalise_parquet_row(obj: dict[str, Any], id_field: str | None = None) -> dict[str, Any]:
    """Parquet has no free-form JSON: messages (or conversations) or tools may be stored as JSON strings,
    structs add nulls. `conversations` is touched only where `messages` is null, the one it is read from, so
    every row an older reader accepted keeps its pin hash. An integer `id` column is read as its decimal strings
    only where `id` is the id field (`id_field` None or "id"), as it always was; under another id field it is a
    column like any other and keeps its integers, as the same line in JSONL does."""
    if (id_field or "id") == "id":
        raw_id = obj.get("id")
        if isinstance(raw_id, int) and not isinstance(raw_id, bool):
            obj["id"] = str(raw_id)  # an integer column: one type for every row, so no collision (module doc)
    keys = ["messages", "tools"] if obj.get("messages") is not None else ["messages", "conversations", "tools"]
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str | bytes):
            with contextlib.suppress(orjson.JSONDecodeError):
                obj[key] = orjson.loads(value)
    for key in keys[:-1]:
        messages = obj.get(key)
        if isinstance(messages, list):
            obj[key] = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]
    return obj


# -- JSON array files ------------------------------------------------------------------------------------------

_JSON_WS = b" \t\r\n"
_NOT_WS = re.compile(rb"[^ \t\r\n]")
# Only brackets and commas outside strings delimit elements. One match skips, in C, every other byte and every
# whole string (possessive: no backtracking), then takes one of: an opening bracket (group 1), a closing one (2),
# a comma (3), the quote of a string the read ends inside (4), or the read's end (no group).
_ARRAY_TOKEN = re.compile(rb'(?:[^"\[\]{},]++|"(?:[^"\\]++|\\.)*+")*+(?:([\[{])|([\]}])|(,)|(")|\Z)', re.DOTALL)
# The rest of a string a read ended inside: group 1 is its closing quote, absent when this read ends in it too.
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+(")?', re.DOTALL)
_OPENS, _CLOSES, _COMMA, _OPEN_STRING = 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class ArrayBreak:
    """Where a JSON array stops being readable: everything from `offset` on is one line set aside (bad_json)."""

    offset: int
    reason: str
    excerpt: bytes


def iter_json_array(
    file: IO[bytes], path: Path | str = "", chunk_size: int | None = None
) -> Iterator[tuple[int, bytes, Any] | ArrayBreak]:
    """The elements of the JSON array in `file` (open binary, at its start), streamed `chunk_size` bytes at a
    time (default JSON_CHUNK_SIZE): (offset, bytes, parsed value) per element, its byte span exact, and last an
    ArrayBreak where the array is truncated or invalid. Memory: one read and the element being read."""
    for index, span in enumerate(_ArraySpans(file, path, chunk_size or JSON_CHUNK_SIZE)):
        if isinstance(span, ArrayBreak):
            yield span
            return
        offset, data = span
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            yield ArrayBreak(
                offset,
                f"bad JSON: the array breaks at element {index + 1} (byte offset {offset}): {error}; it and "
                "everything after it are set aside",
                data[:200],
            )
            return
        yield offset, data, value


class _ArraySpans:
    """Each top-level element's (offset, bytes) of a JSON array, by bracket depth outside strings (the elements'
    own syntax is left to orjson), then an ArrayBreak if it breaks. `buf` holds the current element's bytes and
    one read; `base` is the file offset of buf[0]."""

    def __init__(self, file: IO[bytes], path: Path | str, chunk_size: int) -> None:
        self.file, self.path, self.chunk_size = file, path, chunk_size
        self.buf = b""
        self.base = 0
        self.eof = False

    def fill(self, keep: int) -> bool:
        """Drop buf[:keep] and append one read; False at the end of the file. A read is at least as long as
        what is kept, so an element of many reads is copied a bounded number of times, not once per read."""
        chunk = b"" if self.eof else self.file.read(max(self.chunk_size, len(self.buf) - keep))
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[keep:] + chunk
        self.base += keep
        return True

    def next_text(self, pos: int) -> int | None:
        """The position of the next non-whitespace byte from `pos` (reading on), None at the end of the file."""
        while (found := _NOT_WS.search(self.buf, pos)) is None:
            if not self.fill(len(self.buf)):
                return None
            pos = 0
        return found.start()

    def __iter__(self) -> Iterator[tuple[int, bytes] | ArrayBreak]:
        while len(self.buf) < len(UTF8_BOM) and self.fill(0):
            pass
        if self.buf[:2] in _UTF16_BOMS:
            raise DatasetError(f"dataset {self.path} is UTF-16 (byte order mark); JSON must be UTF-8")
        pos = self.next_text(len(UTF8_BOM) if self.buf.startswith(UTF8_BOM) else 0)
        if pos is None:
            return  # nothing but whitespace: no element
        buf = self.buf
        if buf[pos : pos + 1] != b"[":
            raise DatasetError(
                f"dataset {self.path} is not a JSON array: it starts with {_excerpt(buf[pos : pos + 40])!r} at byte "
                f"offset {self.base + pos}; format json is one array of conversations (one a line is format jsonl)"
            )
        pos += 1
        start = pos  # where the current element's bytes begin (after `[` or a `,`)
        depth = 1
        count = 0
        in_string = False
        token = _ARRAY_TOKEN.match
        while True:
            if in_string:
                rest = _STRING_REST.match(buf, pos)
                assert rest is not None  # it matches the empty string
                pos = rest.end()
                in_string = rest.group(1) is None
            while not in_string:
                match = token(buf, pos)
                assert match is not None  # it matches at the read's end
                pos = match.end()
                kind = match.lastindex
                if kind == _COMMA:
                    if depth == 1:
                        yield self._span(start, pos - 1)
                        count += 1
                        start = pos
                elif kind == _OPENS:
                    depth += 1
                elif kind == _CLOSES:
                    if depth > 1:
                        depth -= 1
                        continue
                    at = pos - 1
                    if buf[at] != ord("]"):
                        yield self._break(start, count, f"a }} at byte offset {self.base + at} closes nothing")
                        return
                    offset, data = self._span(start, at)
                    if data or count:
                        yield offset, data  # `[]` has no element; `[1,]` an empty one (orjson refuses it)
                        count += 1
                    after = self.next_text(pos)
                    if after is not None:
                        offset = self.base + after
                        yield ArrayBreak(
                            offset,
                            f"bad JSON: text after the array's closing ] at byte offset {offset}; set aside as "
                            f"element {count + 1}",
                            self.buf[after : after + 200],
                        )
                    return
                elif kind == _OPEN_STRING:
                    in_string = True
                else:
                    break  # the read's end
            # The read ended inside an element: keep its bytes, read on.
            if not self.fill(start):
                end = self.base + len(buf)
                yield self._break(
                    start, count, f"the array ends at byte offset {end} before its closing ] (truncated?)"
                )
                return
            buf = self.buf
            pos -= start
            start = 0

    def _span(self, start: int, end: int) -> tuple[int, bytes]:
        """The element between separators, its surrounding whitespace cut: (file offset, bytes)."""
        data = self.buf[start:end]
        stripped = data.lstrip(_JSON_WS)
        return self.base + start + len(data) - len(stripped), stripped.rstrip(_JSON_WS)

    def _break(self, start: int, count: int, what: str) -> ArrayBreak:
        offset, _ = self._span(start, len(self.buf))
        excerpt = self.buf[offset - self.base : offset - self.base + 200]
        return ArrayBreak(
            offset,
            f"bad JSON: the array breaks at element {count + 1} (byte offset {offset}): {what}; it and everything "
            "after it are set aside",
            excerpt,
        )
