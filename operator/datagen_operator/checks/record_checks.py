"""Per-record checks on raw token ids: one implementation for the worker's inline counters,
the canary and `datagen verify`.

Everything here looks at token ids, never at decoded text (field notes 3): `text` is decoded with
skip_special_tokens and can hide or show tags that the ids say otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from datagen_operator.api.resolve import ResolvedModel

# Flag names: stable strings, counted by workers and read by the rolling checks.
TOKEN_COUNT_MISMATCH = "token_count_mismatch"
PROMPT_SUFFIX_LEAK = "prompt_suffix_leak"
NO_THINK_START = "no_think_start"
NO_THINK_END = "no_think_end"
EMPTY_REASONING = "empty_reasoning"
UNEXPECTED_REASONING = "unexpected_reasoning"
TRUNCATED = "truncated"
BAD_TERMINATION = "bad_termination"
UNBALANCED_TOOL_CALLS = "unbalanced_tool_calls"
ABORTED = "aborted"
PROMPT_CLOSES_THINK = "prompt_closes_think"
"""A thinking run whose rendered prompt ends with an empty think block: the template was rendered with
thinking off (the seeds' case), so the model is told not to reason."""

ALL_FLAGS: tuple[str, ...] = (
    TOKEN_COUNT_MISMATCH,
    PROMPT_SUFFIX_LEAK,
    NO_THINK_START,
    NO_THINK_END,
    EMPTY_REASONING,
    UNEXPECTED_REASONING,
    TRUNCATED,
    BAD_TERMINATION,
    UNBALANCED_TOOL_CALLS,
    ABORTED,
    PROMPT_CLOSES_THINK,
)


class TokenLookup(Protocol):
    """The slice of a tokenizer the checks need (transformers tokenizers satisfy it)."""

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...


@dataclass(frozen=True)
class Expectations:
    """What a faithful record of this run looks like, in token ids."""

    thinking: bool
    think_start_id: int | None
    think_end_id: int | None
    stop_token_ids: frozenset[int]
    tool_marker_pairs: tuple[tuple[int, int], ...] = ()
    prompt_prefills_opener: bool = False
    suffix_leak_window: int = 8


def _token_id(tokenizer: TokenLookup, text: str, fixed: int | None) -> int | None:
    token_id = tokenizer.convert_tokens_to_ids(text)
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is None or (unk is not None and token_id == unk and fixed is None):
        return fixed
    return token_id


def expectations_for(resolved: ResolvedModel, tokenizer: TokenLookup) -> Expectations:
    """Expectations from the resolved model knowledge, with ids looked up in the run's tokenizer."""
    preset = resolved.preset
    start_fixed = preset.think_start.id if preset and preset.think_start else None
    end_fixed = preset.think_end.id if preset and preset.think_end else None
    think_start = _token_id(tokenizer, resolved.think_start, start_fixed) if resolved.think_start else None
    think_end = _token_id(tokenizer, resolved.think_end, end_fixed) if resolved.think_end else None
    stops: set[int] = set()
    pairs: list[tuple[int, int]] = []
    if preset is not None:
        for token in preset.stop_tokens:
            token_id = _token_id(tokenizer, token.text, token.id)
            if token_id is not None:
                stops.add(token_id)
        for begin, end in preset.tool_call_markers:
            begin_id, end_id = _token_id(tokenizer, begin.text, begin.id), _token_id(tokenizer, end.text, end.id)
            if begin_id is not None and end_id is not None:
                pairs.append((begin_id, end_id))
    eos = getattr(tokenizer, "eos_token_id", None)
    if not stops and eos is not None:
        stops.add(eos)
    return Expectations(
        thinking=resolved.thinking,
        think_start_id=think_start,
        think_end_id=think_end,
        stop_token_ids=frozenset(stops),
        tool_marker_pairs=tuple(pairs),
        prompt_prefills_opener=bool(preset and preset.thinking.prompt_prefills_opener),
    )


def finish_type(finish_reason: Any) -> str | None:
    """'stop', 'length', 'abort' from SGLang's finish_reason dict (or a JSON-decoded copy)."""
    if isinstance(finish_reason, dict):
        value = finish_reason.get("type")
        return value if isinstance(value, str) else None
    if isinstance(finish_reason, str):
        return finish_reason
    return None


def _leaks_prompt_suffix(input_ids: Sequence[int], output_ids: Sequence[int], extra: int, window: int) -> bool:
    """The upstream bug (sglang 10896, 17240): output_ids start with the prompt's last tokens."""
    if extra <= 0 or not input_ids:
        return False
    n = min(extra, window, len(input_ids), len(output_ids))
    return n > 0 and list(output_ids[:n]) == list(input_ids[len(input_ids) - n :])


def inspect_record(
    input_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: Any,
    completion_tokens: int | None,
    has_tools: bool,
    expect: Expectations,
) -> frozenset[str]:
    """The flags one record raises; an empty set means the record looks faithful."""
    flags: set[str] = set()
    kind = finish_type(finish_reason)
    if kind == "abort":
        flags.add(ABORTED)
    if completion_tokens is not None and len(output_ids) != completion_tokens:
        flags.add(TOKEN_COUNT_MISMATCH)
        extra = len(output_ids) - completion_tokens
        if _leaks_prompt_suffix(input_ids, output_ids, extra, expect.suffix_leak_window):
            flags.add(PROMPT_SUFFIX_LEAK)
    if kind == "length":
        flags.add(TRUNCATED)
    elif kind == "stop" and (not output_ids or output_ids[-1] not in expect.stop_token_ids):
        flags.add(BAD_TERMINATION)

    if expect.think_end_id is not None:
        _check_reasoning(input_ids, output_ids, kind, expect, flags)
    if has_tools and expect.tool_marker_pairs and kind == "stop":
        for begin, end in expect.tool_marker_pairs:
            if output_ids.count(begin) != output_ids.count(end):
                flags.add(UNBALANCED_TOOL_CALLS)
                break
    return frozenset(flags)


def _find(ids: Sequence[int], token: int | None, stop: int | None = None) -> int:
    """Index of `token` in ids[:stop], or -1; one C-level scan, no copy (this runs on every record)."""
    if token is None:
        return -1
    try:
        return ids.index(token, 0, len(ids) if stop is None else stop)
    except ValueError:
        return -1


def _check_reasoning(
    input_ids: Sequence[int], output_ids: Sequence[int], kind: str | None, expect: Expectations, flags: set[str]
) -> None:
    end_id, start_id = expect.think_end_id, expect.think_start_id
    end_at = _find(output_ids, end_id)
    if expect.thinking and start_id is not None and list(input_ids[-2:]) == [start_id, end_id]:
        flags.add(PROMPT_CLOSES_THINK)
    if not expect.thinking:
        # The prompt already closed an empty think block: any think tag in the output is reasoning
        # the run did not ask for (the template and the model disagree).
        if end_at >= 0 or _find(output_ids, start_id) >= 0:
            flags.add(UNEXPECTED_REASONING)
        return
    if end_at < 0:
        # A truncated answer may stop inside the reasoning: that is truncation, not a missing closer.
        if kind != "length":
            flags.add(NO_THINK_END)
        return
    # The opener is either the last prompt token (the template prefills it) or early in the output.
    if start_id is None or (input_ids and input_ids[-1] == start_id):
        reasoning_from = 0
    else:
        opened_at = _find(output_ids, start_id, end_at)
        if opened_at < 0:
            flags.add(NO_THINK_START)
            return
        reasoning_from = opened_at + 1
    if end_at - reasoning_from <= 0:
        flags.add(EMPTY_REASONING)
