"""Reasoning parsing of the chat endpoint, as SGLang 0.5.23 does it (non-streaming): the simulator's chat endpoint
and the split of a regenerated answer into the next turn's history (prompts/conversation.py) both use it.

Only `/v1/chat/completions` (and `/separate_reasoning`) run these; `/generate` never does (SGLang 0.5.23
sglang/srt/entrypoints/http_server.py: `generate_request` returns the tokenizer manager's output as it is).
Ported from sglang/srt/parser/reasoning_parser.py, harmony_parser.py and the force-reasoning decision of
entrypoints/openai/serving_chat.py with parser/template_detection.py:

- `force_reasoning` (the output starts inside reasoning) = the chat template is "always on" (it prefills the
  opener without a switch, or speaks harmony) OR the request asks for reasoning (the template's toggle and its
  default, read from the template text, else the parser's own default) OR the parser always forces it
  (`qwen3-thinking`, `gpt-oss`, `minimax`; DeepSeekR1Detector) and never for `kimi`.
- Think-tag detectors (`BaseReasoningFormatDetector.detect_and_parse`): in reasoning when forced or the start tag
  occurs; leading start tags are removed; the first end tag splits reasoning from content (neither stripped);
  without an end tag, a tool-start token (`kimi_k2`, `qwen3`, `glm45`) ends reasoning, else all is reasoning.
- Harmony (`gpt-oss`): analysis messages are reasoning, final messages content, commentary tool calls kept
  raw in the content for the tool-call parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

HARMONY_PARSER = "gpt-oss"
ReasoningDefault = Literal["always", "thinking", "enable_thinking", "explicit_thinking"]


@dataclass(frozen=True, slots=True)
class Detector:
    start: str
    end: str
    tool_start: str | None = None
    forced: bool | None = None
    """True/False: the detector (or ReasoningParser) fixes force_reasoning whatever the request says."""
    default: ReasoningDefault = "always"
    """The detector's `reasoning_default`: whether a request reasons when the template shows no toggle."""


DETECTORS: dict[str, Detector] = {
    "kimi_k2": Detector("<think>", "</think>", "<|tool_calls_section_begin|>", default="thinking"),
    "kimi": Detector("◁think▷", "◁/think▷", forced=False),
    "qwen3": Detector("<think>", "</think>", "<tool_call>", default="enable_thinking"),
    "qwen3-thinking": Detector("<think>", "</think>", "<tool_call>", forced=True, default="enable_thinking"),
    "minimax": Detector("<think>", "</think>", "<tool_call>", forced=True, default="enable_thinking"),
    "deepseek-r1": Detector("<think>", "</think>", forced=True),
    "deepseek-v3": Detector("<think>", "</think>", "<tool_call>", default="explicit_thinking"),
    "glm45": Detector("<think>", "</think>", "<tool_call>", default="enable_thinking"),
    HARMONY_PARSER: Detector("<|channel|>analysis<|message|>", "<|end|>", forced=True),
}


@dataclass(frozen=True, slots=True)
class ReasoningToggle:
    """What template detection infers: always on, or a template variable and its default."""

    always_on: bool = False
    variable: str | None = None
    default_enabled: bool | None = None


def _default_set(variable: str, value: str) -> str:
    return rf"{{%\s*if\s+not\s+{variable}\s+is\s+defined\s*%}}.*?{{%\s*set\s+{variable}\s*=\s*(?:{value})\s*%}}"


def _default_true(variable: str) -> tuple[str, ...]:
    return (
        _default_set(variable, "true|True"),
        rf"set\s+{variable}\s*=\s*{variable}\s+if\s+{variable}\s+is\s+defined\s+else\s+(?:true|True)",
        rf"{variable}\s+is\s+defined\s+and\s+(?:{variable}\s+is\s+false|not\s+{variable})",
        rf"{variable}\s+is\s+not\s+defined\s+or\s+{variable}",
        rf"namespace\([^)]*{variable}\s*=\s*true",
    )


# template_detection.REASONING_MODE_RULES, in order, for the formats the simulator serves (the `| default()`
# filter rule and other families' rules are not modelled).
_TOGGLE_RULES: tuple[tuple[ReasoningToggle, tuple[str, ...], tuple[str, ...]], ...] = (
    (ReasoningToggle(always_on=True), (re.escape("<|channel|>"),), ()),
    (ReasoningToggle(always_on=True), (r"<\|im_start\|>assistant\\n<think>\\n",), ("enable_thinking", "thinking")),
    (ReasoningToggle(False, "enable_thinking", False), (_default_set("enable_thinking", "false|False"),), ()),
    (ReasoningToggle(False, "enable_thinking", True), _default_true("enable_thinking"), ()),
    (ReasoningToggle(False, "thinking", False), (_default_set("thinking", "false|False"),), ()),
    (ReasoningToggle(False, "thinking", True), _default_true("thinking"), ()),
)


def template_toggle(template: str | None) -> ReasoningToggle | None:
    """SGLang's `detect_reasoning_pattern` on a chat template (None: no pattern found)."""
    if not template:
        return None
    for toggle, patterns, absent in _TOGGLE_RULES:
        if any(re.search(pattern, template, re.DOTALL) for pattern in patterns) and not any(
            word in template for word in absent
        ):
            return toggle
    return None


def force_reasoning(parser: str, template: str | None, template_kwargs: Mapping[str, Any]) -> bool:
    """Whether SGLang parses the chat output as starting inside reasoning (see the module docstring)."""
    detector = DETECTORS[parser]
    if detector.forced is not None:
        return detector.forced
    toggle = template_toggle(template)
    if toggle is not None and toggle.always_on:
        return True
    if toggle is None:
        if detector.default == "always":
            return True
        if detector.default == "explicit_thinking":
            return template_kwargs.get("thinking") is True
        return template_kwargs.get(detector.default) is not False
    if toggle.variable is None or toggle.default_enabled is None:
        return False
    if toggle.default_enabled:
        return template_kwargs.get(toggle.variable) is not False
    return template_kwargs.get(toggle.variable) is True


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    reasoning: str | None
    """None when the parser found no reasoning (or there is no parser)."""
    content: str


def _split_think_tags(text: str, detector: Detector, forced: bool) -> ReasoningSplit:
    if not forced and detector.start not in text:
        return ReasoningSplit(None, text)
    body = text
    while body.startswith(detector.start):
        body = body[len(detector.start) :]
    if detector.end in body:
        reasoning, content = body.split(detector.end, 1)
        return ReasoningSplit(reasoning or None, content)
    tool_at = body.find(detector.tool_start) if detector.tool_start else -1
    if tool_at != -1:
        return ReasoningSplit(body[:tool_at] or None, body[tool_at:])
    return ReasoningSplit(body or None, "")


def split_reasoning(text: str, parser: str | None, forced: bool) -> ReasoningSplit:
    """Split decoded output text as the launch-time `--reasoning-parser` would, `forced` as the server decided."""
    detector = DETECTORS.get(parser or "")
    if detector is None:
        # No parser, or one whose format the simulator does not model: nothing is recognised.
        return ReasoningSplit(None, text)
    if parser == HARMONY_PARSER:
        return _split_harmony(text)
    return _split_think_tags(text, detector, forced if detector.forced is None else detector.forced)


# -- harmony (sglang/srt/parser/harmony_parser.py, CanonicalStrategy, one-shot) -----------------------------------
_HARMONY_TOKENS = {
    "<|start|>": "START", "<|channel|>": "CHANNEL", "<|message|>": "MESSAGE", "<|constrain|>": "CONSTRAIN",
    "<|end|>": "END", "<|call|>": "CALL", "<|return|>": "RETURN",
}  # fmt: skip
_HARMONY_TOKEN = re.compile("|".join(map(re.escape, _HARMONY_TOKENS)))


def _harmony_tokens(text: str) -> list[tuple[str, int, int]]:
    tokens, position = [], 0
    for match in _HARMONY_TOKEN.finditer(text):
        if match.start() > position:
            tokens.append(("TEXT", position, match.start()))
        tokens.append((_HARMONY_TOKENS[match.group()], match.start(), match.end()))
        position = match.end()
    if position < len(text):
        tokens.append(("TEXT", position, len(text)))
    return tokens


def _channel(header: str) -> str | None:
    header = header.strip().lower()
    return next((name for name in ("analysis", "commentary", "final") if header.startswith(name)), None)


def _header_marks(tokens: list[tuple[str, int, int]], at: int) -> tuple[int | None, int | None]:
    """Token indexes of the `<|channel|>` and `<|message|>` of the harmony header starting at token `at`."""
    position = at + 1 if tokens[at][0] == "START" else at
    channel_at = message_at = None
    for index in range(position, len(tokens)):
        if tokens[index][0] == "CHANNEL" and channel_at is None:
            channel_at = index
        elif tokens[index][0] == "MESSAGE":
            message_at = index
            break
    return channel_at, message_at


def _harmony_block(text: str, tokens: list[tuple[str, int, int]], at: int) -> tuple[str, str, int] | None:
    """(event type, content, next token index) of the message starting at token `at`, or None if incomplete."""
    channel_at, message_at = _header_marks(tokens, at)
    if message_at is None:
        return None
    content_start = tokens[message_at][2]
    if channel_at is None:  # a tool response: straight to a message
        end_at = next(
            (i for i in range(message_at + 1, len(tokens)) if tokens[i][0] in ("END", "CALL", "RETURN")), None
        )
        return None if end_at is None else ("normal", text[content_start : tokens[end_at][1]], end_at + 1)
    header_start = tokens[channel_at + 1][1] if channel_at + 1 < len(tokens) else tokens[channel_at][2]
    channel = _channel(text[header_start : tokens[message_at][1]])
    if channel is None:
        return None
    enders = ("RETURN",) if channel == "final" else ("END", "CALL")
    end_at = next((i for i in range(message_at + 1, len(tokens)) if tokens[i][0] in enders), len(tokens))
    if end_at == len(tokens):
        return ("normal", text[content_start:], end_at) if channel == "final" else None
    kind, _, end = tokens[end_at]
    content = text[content_start : tokens[end_at][1]]
    if kind == "CALL":  # a tool call, kept raw (from its <|start|>) for the tool-call parser
        return "tool_call", text[tokens[at][1] : end], end_at + 1
    if channel == "analysis":
        return "reasoning", content, end_at + 1
    if channel == "final" and end_at + 1 < len(tokens) and tokens[end_at + 1][0] == "TEXT":
        trailing = tokens[end_at + 1]
        return "normal", content + text[trailing[1] : trailing[2]], end_at + 2
    return "normal", content, end_at + 1


def harmony_events(text: str) -> tuple[list[tuple[str, str]], str]:
    """(event type, content) of each harmony message parsed so far, and the text held back for the next parse;
    a tool call's content is its raw block, from `<|start|>` through `<|call|>`."""
    events: list[tuple[str, str]] = []
    tokens = _harmony_tokens(text)
    index = 0
    while index < len(tokens):
        kind, start, end = tokens[index]
        if kind in ("START", "CHANNEL"):
            block = _harmony_block(text, tokens, index)
            if block is None:
                partial = _harmony_partial_analysis(text, tokens, index)
                if partial is None:
                    return events, text[start:]
                events.append(("reasoning", partial[0]))
                return events, partial[1]
            events.append(block[:2])
            index = block[2]
            continue
        content = text[start:end]
        after_call = index > 0 and tokens[index - 1][0] == "CALL"
        filler = after_call and (kind == "MESSAGE" or (kind == "TEXT" and content.strip().lower() == "commentary"))
        if kind == "TEXT" and index == len(tokens) - 1:
            events.append(("normal", content))  # (a streaming prefix hold never matters one-shot)
        elif not filler and content.strip() not in _HARMONY_TOKENS:
            events.append(("normal", content))
        index += 1
    return events, ""


def _harmony_partial_analysis(text: str, tokens: list[tuple[str, int, int]], at: int) -> tuple[str, str] | None:
    """An unfinished analysis message: its content so far, and the header kept for the next parse."""
    channel_at, message_at = _header_marks(tokens, at)
    if channel_at is None or message_at is None:
        return None
    header_start = tokens[channel_at + 1][1] if channel_at + 1 < len(tokens) else tokens[channel_at][2]
    if _channel(text[header_start : tokens[message_at][1]]) != "analysis":
        return None
    content_start = tokens[message_at][2]
    return text[content_start:], text[tokens[at][1] : content_start]


def _split_harmony(text: str) -> ReasoningSplit:
    """GptOssDetector.detect_and_parse: parse, then flush what was held back."""
    if "<|channel|>" not in text and "<|start|>" not in text:
        return ReasoningSplit(None, "")  # the text fallback strategy is not modelled; it finds no channels here
    events, rest = harmony_events(text)
    events += harmony_events(rest)[0]
    reasoning = "".join(content for kind, content in events if kind == "reasoning")
    content = "".join(content for kind, content in events if kind in ("normal", "tool_call"))
    return ReasoningSplit(reasoning or None, content)
