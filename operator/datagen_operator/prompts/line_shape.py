"""Whether a parsed dataset line is a conversation this reader knows, and its id.

A line (a JSON array's element, a Parquet row) is a conversation: a `messages` list, or `conversations` when
`messages` is absent or null, of OpenAI messages `{role, content, ...}` (role system/user/assistant/tool; other
keys such as `reasoning_content`, `tool_calls`, `name`, `tool_call_id` are kept) or ShareGPT ones `{from, value}`
(SHAREGPT_ROLES maps `from`), and optionally `tools`. `normalised_messages` hands every caller OpenAI messages: a
ShareGPT message becomes `{role, content}`. An OpenAI message's content is a string or a list of text parts
(engine/chat_content.py: a part that is not text sets the line aside as `non_text_content`); `tools` are read as
SGLang and SpecForge read them (engine/chat_tools.py: a JSON string, bare function objects, type names).

Ids live in the id field (`id`, or spec.dataset.idField). A line that has the field holds its id there, as
a JSON string or an integer (SpecForge's own test data numbers its lines), read as its decimal string: the
output keys records by a string id (Parquet column, resume keys, rejects, verify). Integer 1 and string "1" are
then one id; where one dataset holds both, the later line is set aside as `duplicate_id` with a reason naming
the collision (prompts/shards.py `Assigner.duplicate`), as any repeated id is. Other ids (a number with a
fraction, a boolean, an object) are refused per line (cause `bad_id`).

A line WITHOUT the id field gets an id derived from its content (`derived_id`): "sha256:" and the first 16 hex
digits of the SHA-256 of `orjson.dumps({"messages": <its normalised messages>, "tools": <its tools or null>},
OPT_SORT_KEYS)`. It depends on nothing but the conversation, so it survives reordering the file, and two equal
conversations are one prompt: the second is set aside as `duplicate_id`.

A line set aside carries a `cause` (see CAUSES: the first of its problems) and a human reason naming every
problem it has, joined by "; ". In a reason, a number after a word counts from 1 ("line 12", "message 3",
"element 4"); an index in brackets is JSON's, from 0 ("messages[2]", "tools[0]"), and so is a byte offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import sha256
from typing import Any

import orjson

from datagen_operator.api.progress import DUPLICATE_ID as DUPLICATE_ID
from datagen_operator.engine.chat_content import NON_TEXT_CONTENT, content_problem
from datagen_operator.engine.chat_tools import json_type as _json_type
from datagen_operator.engine.chat_tools import read_tools

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


@dataclass(frozen=True, slots=True)
class Problem:
    """Why one prompt object is unusable: a `cause` from CAUSES and a reason a person can act on."""

    cause: str
    reason: str


def id_key(id_field: str | None) -> str:
    """The key a line's id is read from: spec.dataset.idField, else `id`."""
    return id_field or "id"


def validate_prompt(obj: Any, id_field: str | None = None) -> tuple[str | None, Problem | None]:
    """(id, None) for a usable prompt object, else (id-if-any, the problem: every one the line has, in one
    reason). The id is the id field's (`id_field`, default `id`; an integer as its decimal string), else
    derived from the content (module doc)."""
    if not isinstance(obj, dict):
        return None, Problem(NOT_OBJECT, f"expected a JSON object, got {_json_type(obj)}")
    id_name = id_key(id_field)
    problems: list[Problem] = []
    prompt_id: str | None = None
    if id_name in obj:
        prompt_id, id_problem = _id_problem(obj[id_name], id_name)
        if id_problem is not None:
            problems.append(id_problem)
    messages: list[dict[str, Any]] | None = None
    key = _messages_key(obj)
    if key is not None:
        messages, message_problems = _judge_messages(obj[key], key)
        problems += message_problems
    else:
        other = [name for name in obj if name != id_name]
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
    if id_name not in obj:
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


def _id_problem(raw_id: Any, id_name: str) -> tuple[str | None, Problem | None]:
    """The id held in the id field (an integer as its decimal string), or why it is unusable."""
    if raw_id is None:
        return None, Problem(BAD_ID, f"missing {id_name}")
    if type(raw_id) is int:
        return str(
            raw_id
        ), None  # "1" and 1 in one dataset: the later is a duplicate, named (shards.Assigner.duplicate)
    if not isinstance(raw_id, str):
        return None, Problem(
            BAD_ID,
            f"{id_name} must be a JSON string or an integer, got {_json_type(raw_id)} "
            f"{orjson.dumps(raw_id).decode()[:40]}",
        )
    if not raw_id:
        return None, Problem(BAD_ID, f"empty {id_name}")
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


def plain_prompt_id(obj: Any, id_name: str = "id") -> str | None:
    """The id of a prompt of the common shape (an object with a non-empty string id, a non-empty `messages`
    list of objects each with an OpenAI role and string content, or none outside a user message; no tools), else
    None: then validate_prompt must judge it. Every object this accepts, validate_prompt accepts with the same id
    (it checks a subset of the same conditions, on orjson's exact types), so the scan may skip validate_prompt
    for it (tests/worker/test_dataset_scan.py)."""
    if type(obj) is not dict:
        return None
    prompt_id = obj.get(id_name)
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
