"""Tool calls per family format as the simulated model writes them (engine/tool_calls.py reads them as SGLang's
detectors do, for the simulator's chat endpoint and the run's own split of an answer alike), and finding the tools
the chat template declared in a prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datagen_operator.tokenizer.families import ChatFormat, ToolCallFormat


@dataclass(frozen=True, slots=True)
class DeclaredTool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


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
