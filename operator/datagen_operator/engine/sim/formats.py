"""Tool calls per family format, both ways: the text the model writes, and what SGLang's detectors read from it.

Writing and reading live together so the simulator's chat endpoint reads exactly what its model writes. The
readers follow SGLang 0.5.23's function-call detectors (sglang/srt/function_call/*_detector.py) for the
shapes the simulator produces: `detect_and_parse` returns the normal text and the calls, arguments as the
JSON string the detector builds. Also here: finding the tools the chat template declared in a prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datagen_operator.engine.reasoning import harmony_events
from datagen_operator.tokenizer.families import ChatFormat, ToolCallFormat


@dataclass(frozen=True, slots=True)
class DeclaredTool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str
    """The JSON string SGLang puts in `function.arguments`."""


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    normal_text: str
    calls: list[ParsedCall]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- writing -------------------------------------------------------------------------------------------------------
def _write_kimi_k2(calls: Sequence[ToolCall], first: bool) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{call.name}:{index}<|tool_call_argument_begin|>{_json(call.arguments)}"
        "<|tool_call_end|>"
        for index, call in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"


def _write_qwen(calls: Sequence[ToolCall], first: bool) -> str:
    return "".join(
        f'\n<tool_call>\n{{"name": {_json(call.name)}, "arguments": {_json(call.arguments)}}}\n</tool_call>'
        for call in calls
    )


def _write_deepseek_v3(calls: Sequence[ToolCall], first: bool) -> str:
    body = "\n".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{call.name}\n```json\n{_json(call.arguments)}\n```<｜tool▁call▁end｜>"
        for call in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


def _glm_value(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _write_glm45(calls: Sequence[ToolCall], first: bool) -> str:
    return "".join(
        f"\n<tool_call>{call.name}\n"
        + "".join(
            f"<arg_key>{key}</arg_key>\n<arg_value>{_glm_value(v)}</arg_value>\n" for key, v in call.arguments.items()
        )
        + "</tool_call>"
        for call in calls
    )


def _write_harmony(calls: Sequence[ToolCall], first: bool) -> str:
    # One call per turn: <|call|> (written by the caller as the stop token) ends generation.
    call = calls[0]
    header = "" if first else "<|start|>assistant"
    return f"{header}<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>{_json(call.arguments)}"


WRITERS: dict[ToolCallFormat, Callable[[Sequence[ToolCall], bool], str]] = {
    "kimi_k2": _write_kimi_k2,
    "qwen": _write_qwen,
    "deepseek_v3": _write_deepseek_v3,
    "glm45": _write_glm45,
    "harmony": _write_harmony,
}
SINGLE_CALL_FORMATS = frozenset({"harmony"})


def write_tool_calls(chat: ChatFormat, calls: Sequence[ToolCall], first: bool) -> str:
    """The text of `calls` in the family's format (`first`: nothing precedes it in the output)."""
    return WRITERS[chat.tool_call_format](calls, first)


# -- reading (SGLang's detectors, non-streaming) -------------------------------------------------------------------
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>[^\s<|]+)\s*<\|tool_call_argument_begin\|>\s*(?P<arguments>\{.*?\})\s*"
    r"<\|tool_call_end\|>",
    re.DOTALL,
)
_KIMI_ID = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")


def _read_kimi_k2(text: str, tools: dict[str, dict[str, Any]]) -> ParsedToolCalls:
    start = text.find("<|tool_calls_section_begin|>")
    if start == -1:
        return ParsedToolCalls(text, [])
    calls = []
    for match in _KIMI_CALL.finditer(text):
        name = _KIMI_ID.match(match.group("id"))
        if name is not None:  # the name comes from the id; the arguments pass through as written
            calls.append(ParsedCall(name.group("name"), match.group("arguments")))
    return ParsedToolCalls(text[:start], calls)


def _known(name: str, arguments: Any, tools: dict[str, dict[str, Any]]) -> list[ParsedCall]:
    """SGLang's parse_base_json: unknown tools are dropped; arguments re-serialised."""
    return [ParsedCall(name, _json(arguments))] if name in tools else []


def _read_qwen(text: str, tools: dict[str, dict[str, Any]]) -> ParsedToolCalls:
    start = text.find("<tool_call>\n")
    if start == -1:
        return ParsedToolCalls(text, [])
    calls = []
    for body in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
        try:
            action = json.loads(body.strip())
        except ValueError:
            continue
        for item in action if isinstance(action, list) else [action]:
            calls += _known(item.get("name"), item.get("parameters") or item.get("arguments", {}), tools)
    return ParsedToolCalls(text[:start].strip(), calls)


_DEEPSEEK_CALL = re.compile(r"<｜tool▁call▁begin｜>.*?<｜tool▁call▁end｜>", re.DOTALL)
_DEEPSEEK_DETAIL = re.compile(
    r"<｜tool▁call▁begin｜>(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```<｜tool▁call▁end｜>", re.DOTALL
)


def _read_deepseek_v3(text: str, tools: dict[str, dict[str, Any]]) -> ParsedToolCalls:
    start = text.find("<｜tool▁calls▁begin｜>")
    if start == -1:
        return ParsedToolCalls(text, [])
    calls = []
    try:
        for block in _DEEPSEEK_CALL.findall(text):
            detail = _DEEPSEEK_DETAIL.search(block)
            assert detail is not None
            calls += _known(detail.group(2), json.loads(detail.group(3)), tools)
    except (AssertionError, ValueError):
        return ParsedToolCalls(text, [])
    return ParsedToolCalls(text[:start].strip(), calls)


_GLM_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_GLM_DETAIL = re.compile(r"<tool_call>(.*?)(?:\\n|\n)(.*)</tool_call>", re.DOTALL)
_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_argument(raw: str, schema_type: Any) -> Any:
    if schema_type == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _read_glm45(text: str, tools: dict[str, dict[str, Any]]) -> ParsedToolCalls:
    start = text.find("<tool_call>")
    if start == -1:
        return ParsedToolCalls(text, [])
    calls = []
    for block in _GLM_CALL.findall(text):
        detail = _GLM_DETAIL.search(block)
        if detail is None:
            continue
        name = detail.group(1) or ""
        properties = tools.get(name, {}).get("properties") or {}
        arguments = {
            key.strip(): _glm_argument(value, (properties.get(key.strip()) or {}).get("type"))
            for key, value in _GLM_ARGUMENT.findall(detail.group(2) or "")
        }
        calls += _known(name, arguments, tools)
    return ParsedToolCalls(text[:start].strip(), calls)


_HARMONY_TOOL = re.compile(
    r"to=([a-zA-Z_][a-zA-Z0-9_.-]*)\s*<\|constrain\|>json<\|message\|>(.*?)(?:<\|call\|>|$)", re.DOTALL
)


def _read_harmony(text: str, tools: dict[str, dict[str, Any]]) -> ParsedToolCalls:
    """The gpt-oss detector: harmony events again over the reasoning parser's normal text (which keeps each
    call block raw); calls from tool-call events, the normal events joined by spaces."""
    if "<|start|>assistant<|channel|>commentary" not in text:
        return ParsedToolCalls(text, [])
    events, rest = harmony_events(text)
    events += harmony_events(rest)[0]
    calls, normal = [], []
    for kind, content in events:
        if kind == "normal":
            normal.append(content)
        elif kind == "tool_call" and (match := _HARMONY_TOOL.search(content)) is not None:
            try:
                arguments = json.loads(match.group(2)) if match.group(2).strip() else {}
            except ValueError:
                continue
            calls += _known(match.group(1).split(".")[-1], arguments, tools)
    return ParsedToolCalls(" ".join(normal).strip(), calls)


READERS: dict[ToolCallFormat, Callable[[str, dict[str, dict[str, Any]]], ParsedToolCalls]] = {
    "kimi_k2": _read_kimi_k2,
    "qwen": _read_qwen,
    "deepseek_v3": _read_deepseek_v3,
    "glm45": _read_glm45,
    "harmony": _read_harmony,
}
# `--tool-call-parser` names (as given and as SGLang resolves them) -> the format their detector reads.
PARSER_FORMATS: dict[str, ToolCallFormat] = {
    "kimi_k2": "kimi_k2",
    "qwen": "qwen",
    "qwen25": "qwen",
    "deepseekv3": "deepseek_v3",
    "glm": "glm45",
    "glm45": "glm45",
    "gpt-oss": "harmony",
}


def read_tool_calls(parser: str, text: str, tools: Sequence[dict[str, Any]]) -> ParsedToolCalls:
    """What `--tool-call-parser parser` extracts from `text` (a parser the simulator does not model finds none)."""
    tool_format = PARSER_FORMATS.get(parser)
    if tool_format is None:
        return ParsedToolCalls(text, [])
    schemas = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return READERS[tool_format](text, schemas)


# -- tools declared in a prompt ------------------------------------------------------------------------------------
_TYPESCRIPT_TOOL = re.compile(r"^type ([A-Za-z_][\w.\-]*) = \(_: (.*)\) => any;$", re.MULTILINE)


def _json_values(text: str) -> list[Any]:
    """Every top-level JSON object or array in `text`, in order."""
    decoder = json.JSONDecoder()
    values, index = [], 0
    while (index := min((i for i in (text.find("{", index), text.find("[", index)) if i != -1), default=-1)) != -1:
        try:
            value, index = decoder.raw_decode(text, index)
        except ValueError:
            index += 1
            continue
        values += value if isinstance(value, list) else [value]
    return values


def declared_tools(chat: ChatFormat, prompt_text: str) -> tuple[DeclaredTool, ...]:
    """The tools the family's template declared in `prompt_text` (none when it declared none)."""
    start = prompt_text.find(chat.tool_declare_open) if chat.tool_declare_open else -1
    if start == -1:
        return ()
    start += len(chat.tool_declare_open)
    end = prompt_text.find(chat.tool_declare_close, start)
    region = prompt_text[start : end if end != -1 else len(prompt_text)]
    if chat.tool_declaration == "typescript":
        entries: list[Any] = []
        for name, parameters in _TYPESCRIPT_TOOL.findall(region):
            try:
                schema = json.loads(parameters)
            except ValueError:
                schema = {}
            entries.append({"name": name, "parameters": schema})
    else:
        entries = _json_values(region)
    tools = []
    for entry in entries:
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            tools.append(DeclaredTool(function["name"], parameters if isinstance(parameters, dict) else {}))
    return tuple(tools)
