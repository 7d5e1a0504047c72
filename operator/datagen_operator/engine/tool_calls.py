"""Tool calls as SGLang 0.5.23's `--tool-call-parser` reads them from a chat answer (non-streaming), per parser.

The chat endpoint (serving_chat `_process_tool_calls`) runs the launch's parser over the text the reasoning parser
left: when the detector's `has_tool_call` finds its opener, `parse_non_stream` returns the normal text and the
calls (name, arguments as the JSON string the detector builds), and the message's content is that normal text; a
call is only one SGLang parses (an undeclared tool or arguments that are no JSON parse as none). Before that, the
detokenizer trims the matched stop token, except gpt-oss's `<|call|>` under the gpt-oss parser
(`DetokenizerManager.trim_matched_stop`). `TOOL_CALL_PARSERS` is the table of both per parser; the readers are
ported from sglang/srt/function_call/*_detector.py for the shapes the model families write, and
tests/contract/test_tool_calls.py runs SGLang's own parsers against them. The simulator's chat endpoint and the
run's split of a regenerated answer (prompts/conversation.py) both read calls here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datagen_operator.engine.reasoning import harmony_events
from datagen_operator.tokenizer.families import ToolCallFormat

GPT_OSS_CALL_ID = 200_012
"""gpt-oss's `<|call|>`: it ends a harmony tool call, and is one of the model's stop ids."""


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str
    """The JSON string SGLang puts in `function.arguments`."""

    def as_record(self) -> dict[str, str]:
        return {"name": self.name, "arguments": self.arguments}

    def as_message(self) -> dict[str, Any]:
        """The call in an assistant message, as SGLang's chat endpoint returns it in `tool_calls` (its random
        `id` left out) and as chat templates read it back (`function.name`, `function.arguments`)."""
        return {"type": "function", "function": self.as_record()}


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    normal_text: str
    calls: list[ParsedCall]
    found: bool = False
    """The parser's `has_tool_call`: its opener is in the text (even where no call parses from it)."""


@dataclass(frozen=True, slots=True)
class CallSyntax:
    """How a tool-call parser finds a call: the family's format, the opener its `has_tool_call` looks for, and the
    stop id that ends a call and that the detokenizer keeps for the parser (None: every matched stop is trimmed)."""

    format: ToolCallFormat
    opener: str
    kept_stop_id: int | None = None
    closer: str = ""
    """Where the call ends (the stop id's text where the call ends generation)."""


TOOL_CALL_PARSERS: dict[str, CallSyntax] = {
    "kimi_k2": CallSyntax("kimi_k2", "<|tool_calls_section_begin|>", closer="<|tool_calls_section_end|>"),
    "qwen": CallSyntax("qwen", "<tool_call>\n", closer="\n</tool_call>"),
    "qwen25": CallSyntax("qwen", "<tool_call>\n", closer="\n</tool_call>"),
    "deepseekv3": CallSyntax("deepseek_v3", "<｜tool▁calls▁begin｜>", closer="<｜tool▁calls▁end｜>"),
    "glm": CallSyntax("glm45", "<tool_call>", closer="</tool_call>"),
    "glm45": CallSyntax("glm45", "<tool_call>", closer="</tool_call>"),
    # harmony: a commentary message to the function, its arguments in JSON, ended by <|call|> (which stops
    # generation); the parser finds it only from a message start (the analysis message before it ends with one).
    "gpt-oss": CallSyntax("harmony", "<|start|>assistant<|channel|>commentary", GPT_OSS_CALL_ID, "<|call|>"),
}
"""`--tool-call-parser` name (as given and as SGLang resolves it) -> how it finds a call."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def call_names(calls: Sequence[ParsedCall]) -> str:
    """The tools an answer calls, for a message (a call SGLang's parser could not read names none)."""
    return ", ".join(call.name for call in calls) or "a call no tool parses from"


def stop_kept(tool_call_parser: str | None, matched: int) -> bool:
    """Whether the detokenizer keeps the matched stop id at the end of the output (it trims every other)."""
    syntax = TOOL_CALL_PARSERS.get(tool_call_parser or "")
    return syntax is not None and syntax.kept_stop_id == matched


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


def _schemas(tools: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The declared tools by name: their `parameters` (bare function objects read as wrapped ones)."""
    schemas = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = dict(parameters) if isinstance(parameters, Mapping) else {}
    return schemas


def read_tool_calls(parser: str | None, text: str, tools: Sequence[Any]) -> ParsedToolCalls:
    """What `--tool-call-parser parser` extracts from `text` for a request declaring `tools` (a parser not
    modelled here, or none, finds none; without tools the chat endpoint runs no parser)."""
    syntax = TOOL_CALL_PARSERS.get(parser or "")
    if syntax is None or not tools or syntax.opener not in text:
        return ParsedToolCalls(text, [])
    parsed = READERS[syntax.format](text, _schemas(tools))
    return ParsedToolCalls(parsed.normal_text, parsed.calls, found=True)
