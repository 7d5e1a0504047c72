"""Reasoning and tool-call parsing of the chat endpoint, as SGLang's detectors do it (non-streaming).

Only `/v1/chat/completions` runs these; `/generate` never does (sglang-contract.md). The split follows
SGLang's BaseReasoningFormatDetector.detect_and_parse: the output is "in reasoning" when the parser
forces it or the think-start tag occurs; the start tag is removed, the text stripped, and the first
end tag splits reasoning from content. `kimi_k2` additionally ends reasoning at
`<|tool_calls_section_begin|>`. `deepseek-r1` and `qwen3-thinking` always start inside reasoning;
the others do when the rendered prompt ended with the think opener (the template's thinking mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from datagen_operator.engine.sglang_names import REASONING_PARSER_TAGS
from datagen_operator.tokenizer import kimi_tokens

ALWAYS_IN_REASONING = frozenset({"deepseek-r1", "qwen3-thinking"})
KIMI_K2 = "kimi_k2"


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str | None
    """None when the parser found no reasoning (or there is no parser)."""
    content: str


def split_reasoning(text: str, parser: str | None, prompt_opened_think: bool) -> ReasoningSplit:
    """Split decoded output text as the launch-time `--reasoning-parser` would."""
    if parser is None or parser not in REASONING_PARSER_TAGS:
        # No parser, or one whose format the simulator does not model: nothing is recognised.
        return ReasoningSplit(None, text)
    start, end = REASONING_PARSER_TAGS[parser]
    forced = parser in ALWAYS_IN_REASONING or (prompt_opened_think and start == kimi_tokens.THINK.content)
    if not forced and start not in text:
        return ReasoningSplit(None, text)
    body = text.replace(start, "").strip()
    end_at = body.find(end)
    if parser == KIMI_K2:
        section_at = body.find(kimi_tokens.TOOL_CALLS_SECTION_BEGIN.content)
        if section_at != -1 and (end_at == -1 or section_at < end_at):
            return ReasoningSplit(body[:section_at] or None, body[section_at:])
    if end_at == -1:
        return ReasoningSplit(body or None, "")
    return ReasoningSplit(body[:end_at] or None, body[end_at + len(end) :].strip())


_KIMI_TOOL_CALL = re.compile(
    re.escape(kimi_tokens.TOOL_CALL_BEGIN.content)
    + r"\s*(?P<id>[^\s<]+?:\d+)\s*"
    + re.escape(kimi_tokens.TOOL_CALL_ARGUMENT_BEGIN.content)
    + r"\s*(?P<arguments>.*?)\s*"
    + re.escape(kimi_tokens.TOOL_CALL_END.content),
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class ToolCallSplit:
    content: str
    tool_calls: list[dict[str, Any]]


def parse_kimi_k2_tool_calls(text: str) -> ToolCallSplit:
    """SGLang's `kimi_k2` tool-call parser: content before the section, calls as OpenAI tool_calls."""
    section_at = text.find(kimi_tokens.TOOL_CALLS_SECTION_BEGIN.content)
    if section_at == -1:
        return ToolCallSplit(text, [])
    calls = []
    for index, match in enumerate(_KIMI_TOOL_CALL.finditer(text, section_at)):
        call_id = match.group("id")
        name = call_id.split(":", 1)[0].split(".", 1)[-1]
        arguments = match.group("arguments")  # passed through as the model wrote it
        calls.append(
            {"id": call_id, "index": index, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return ToolCallSplit(text[:section_at], calls)
