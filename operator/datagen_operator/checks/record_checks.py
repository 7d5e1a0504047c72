"""Per-record checks on raw token ids: one implementation for the worker's inline counters,
the canary and `datagen verify`.

Everything here looks at token ids, never at decoded text: `text` is decoded with skip_special_tokens (true by
default, SGLang 0.5.23 sglang/srt/sampling/sampling_params.py) and can hide or show tags that the ids say otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from datagen_operator.api.flags import (
    ABORTED,
    BAD_TERMINATION,
    EMPTY_REASONING,
    NAN_REPLACED,
    NO_THINK_END,
    NO_THINK_START,
    PROMPT_CLOSES_THINK,
    PROMPT_SUFFIX_LEAK,
    RETRACTED,
    TOKEN_COUNT_MISMATCH,
    TRUNCATED,
    TRUNCATED_BY_MEMORY,
    UNBALANCED_TOOL_CALLS,
    UNEXPECTED_REASONING,
    ends_truncated,
    finish_type,
)
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.presets.sglang_names import SGLANG_ADDITIONAL_STOP_TEXTS
from datagen_operator.presets.think_markers import MarkersWritten, ThinkMarkers, known_markers


class TokenLookup(Protocol):
    """The slice of a tokenizer the checks need (transformers tokenizers satisfy it)."""

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


NO_THINK_END_FOUND, EMPTY, WRITTEN = 0, 1, 2
"""RecordFacts.reasoning: what follows the reasoning's start."""

PROMPT_TAIL_WHITESPACE: tuple[str, ...] = ("\n", "\n\n", " ")
"""Texts a template may write after the think opener or closer (Qwen3-2507 ends the prompt `<think>\n`)."""


class MarkerIds(NamedTuple):
    """Think markers as the run's tokenizer encodes them: one added token each, or the text's ids."""

    markers: ThinkMarkers
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]


@dataclass(frozen=True)
class Expectations:
    """What a faithful record of this run looks like, in token ids."""

    thinking: bool
    think_start_ids: tuple[int, ...]
    """The opener as ids: one token (`<think>`), or several (harmony's `<|channel|>analysis<|message|>`)."""
    think_end_id: int | None
    stop_token_ids: frozenset[int]
    tool_marker_pairs: tuple[tuple[int, int], ...] = ()
    prompt_prefills_opener: bool = False
    suffix_leak_window: int = 8
    prompt_tail_skip_ids: frozenset[int] = frozenset()
    """Whitespace tokens a template may put after the opener or closer at the end of the prompt."""
    other_markers: tuple[MarkerIds, ...] = ()
    """Other families' think markers (presets/think_markers.py) in this tokenizer's ids; none without a
    tokenizer. No flag reads them: where outputs hold them, the canary's verdict names them as the cause."""
    restarted_by_retraction: tuple[str, ...] = ()
    """The run's sampling parameters a retraction restarts (api.spec.SamplingParams.restarted_by_retraction):
    with none, a retraction is harmless (SGLang re-prefills prompt + output) and raises no flag."""
    max_new_tokens: int | None = None
    """What the requests asked for (the canary's own cap for its capped requests); None: not known, no
    `truncated_by_memory`."""

    def for_line(self, thinking: bool | None) -> Expectations:
        """What a faithful record of a line looks like: these, with the thinking of a line that switches it
        itself (its chat_template_kwargs, prompts/render.py `line_thinking`; None: the run's). A thinking-off
        line must not reason, an on line must. The one rule the workers, the canary and verify judge lines by."""
        if thinking is None or thinking == self.thinking:
            return self
        return dataclasses.replace(self, thinking=thinking)


def _token_id(tokenizer: TokenLookup | None, text: str, fixed: int | None) -> int | None:
    if tokenizer is None:
        return fixed
    token_id = tokenizer.convert_tokens_to_ids(text)
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is None or (unk is not None and token_id == unk and fixed is None):
        return fixed
    return token_id


def _opener_ids(tokenizer: TokenLookup | None, text: str, fixed: int | None) -> tuple[int, ...]:
    """A one-token opener by its id; a longer one (harmony's channel header) as the ids it encodes to."""
    token_id = _token_id(tokenizer, text, fixed)
    if tokenizer is None:
        return (token_id,) if token_id is not None else ()
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is not None and token_id != unk:
        return (token_id,)
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def _single_token_ids(tokenizer: TokenLookup, texts: tuple[str, ...]) -> frozenset[int]:
    encoded = (tokenizer.encode(text, add_special_tokens=False) for text in texts)
    return frozenset(ids[0] for ids in encoded if len(ids) == 1)


def expectations_for(
    resolved: ResolvedModel, tokenizer: TokenLookup | None, model_eos_ids: Iterable[int]
) -> Expectations:
    """What a faithful record of this run looks like: the one source the preflight, the worker, the canary, the
    rolling checks, verify and export read. Ids are looked up in the run's tokenizer, else the preset's fixed ids.

    Stop ids are the union SGLang 0.5.23 stops on (`Req._check_token_based_finish`): the request's
    `stop_token_ids` (the preset's stop tokens), `eos_token_id` of the model's config.json and
    generation_config.json (`model_eos_ids`, read by the caller: engine/model_configs.read_model_eos_ids of
    `model_config_dir`), the tokenizer's `eos_token_id`, and the tokenizer's additional stop tokens
    (`attach_additional_stop_token_ids`), the tokenizer being the one SGLang loads (`--tokenizer-path`,
    model.tokenizerPath). An output that ends on any of them ended as SGLang ends it.
    """
    preset = resolved.preset
    start_fixed = preset.think_start.id if preset and preset.think_start else None
    end_fixed = preset.think_end.id if preset and preset.think_end else None
    think_start = _opener_ids(tokenizer, resolved.think_start, start_fixed) if resolved.think_start else ()
    think_end = _token_id(tokenizer, resolved.think_end, end_fixed) if resolved.think_end else None
    stops: set[int] = set(model_eos_ids)
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
    stops |= tokenizer_stop_ids(tokenizer)
    return Expectations(
        thinking=resolved.thinking,
        think_start_ids=think_start,
        think_end_id=think_end,
        stop_token_ids=frozenset(stops),
        tool_marker_pairs=tuple(pairs),
        prompt_prefills_opener=bool(preset and preset.thinking.prompt_prefills_opener),
        prompt_tail_skip_ids=_single_token_ids(tokenizer, PROMPT_TAIL_WHITESPACE) if tokenizer else frozenset(),
        other_markers=_other_marker_ids(tokenizer, resolved) if tokenizer else (),
        restarted_by_retraction=resolved.restarted_by_retraction,
        max_new_tokens=resolved.max_new_tokens,
    )


def _other_marker_ids(tokenizer: TokenLookup, resolved: ResolvedModel) -> tuple[MarkerIds, ...]:
    """Every known marker pair but the run's, as the tokenizer has them (an added token's id, else the text's
    ids: a Qwen3 vocabulary holds `◁think▷` only as text)."""
    own = (
        ThinkMarkers(resolved.think_start, resolved.think_end) if resolved.think_start and resolved.think_end else None
    )
    found = []
    for markers in known_markers():
        if markers == own:
            continue
        start, end = _opener_ids(tokenizer, markers.start, None), _opener_ids(tokenizer, markers.end, None)
        if start and end:
            found.append(MarkerIds(markers, start, end))
    return tuple(found)


def other_markers_in(output_ids: Sequence[int], expect: Expectations) -> MarkersWritten | None:
    """The other family's markers this output holds (the earliest found), None when it holds none. Read where the
    run's own markers are missing (the canary), never per record on the workers' hot path."""
    found: list[tuple[int, MarkersWritten]] = []
    for markers, start_ids, end_ids in expect.other_markers:
        starts_at, ends_at = _find_seq(output_ids, start_ids), _find_seq(output_ids, end_ids)
        positions = [at for at in (starts_at, ends_at) if at >= 0]
        if positions:
            found.append((min(positions), MarkersWritten(markers, starts_at >= 0)))
    return min(found, key=lambda item: item[0])[1] if found else None


def tokenizer_stop_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's part of SGLang's stop set: its `eos_token_id` and the added tokens SGLang registers as
    additional stop ids (`SGLANG_ADDITIONAL_STOP_TEXTS`)."""
    if tokenizer is None:
        return frozenset()
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and not isinstance(eos, bool):
        ids.add(eos)
    get_added_vocab = getattr(tokenizer, "get_added_vocab", None)
    added = get_added_vocab() if callable(get_added_vocab) else {}
    ids |= {added[text] for text in SGLANG_ADDITIONAL_STOP_TEXTS if _is_token_id(added.get(text))}
    return frozenset(ids)


def stop_matched_no_token(finish_reason: Any) -> bool:
    """A `stop` finish whose `matched` is neither a token id nor a list of them. The runs send no stop strings
    (`spec.generation.sampling` refuses `stop`), so in SGLang 0.5.23 this is only its NaN guard
    (`FINISH_MATCHED_STR(matched="NaN happened")`). A plain string finish (no `matched` known) is not one."""
    if not isinstance(finish_reason, dict) or finish_reason.get("type") != "stop" or "matched" not in finish_reason:
        return False
    matched = finish_reason["matched"]
    if isinstance(matched, list):
        return not all(_is_token_id(item) for item in matched)
    return not _is_token_id(matched)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _leaks_prompt_suffix(input_ids: Sequence[int], output_ids: Sequence[int], extra: int, window: int) -> bool:
    """The upstream bug (sglang 10896, 17240): output_ids start with the prompt's last tokens."""
    if extra <= 0 or not input_ids:
        return False
    n = min(extra, window, len(input_ids), len(output_ids))
    return n > 0 and list(output_ids[:n]) == list(input_ids[len(input_ids) - n :])


class RecordFacts(NamedTuple):
    """What the checks read from one record's ids; `flags_of` turns them into flags (the rules, once).

    `record_facts` finds them in one record's sequences (the worker, the canary); `record_columns` finds the
    same facts in a batch of stored records with numpy (`datagen verify`). A fact the rules do not reach for
    this record (say, where the reasoning ends when there is no opener) may be left at its default."""

    kind: str | None
    """'stop', 'length', 'abort' or None (anything else)."""
    count_mismatch: bool = False
    suffix_leak: bool = False
    ends_with_stop: bool = False
    reasoning_starts_in_prompt: bool = False
    """No opener to look for, or the prompt ends with it: the reasoning starts at the first output id."""
    prompt_closes_think: bool = False
    opener_in_output: bool = False
    think_end_in_output: bool = False
    reasoning: int = NO_THINK_END_FOUND
    """After the reasoning's start: NO_THINK_END_FOUND, EMPTY (the closer first) or WRITTEN."""
    tool_calls_unbalanced: bool = False
    stop_not_token: bool = False
    """A `stop` whose `matched` is not a token id (stop_matched_no_token): SGLang's NaN guard."""
    retracted: bool = False
    """meta_info.num_retractions > 0: SGLang retracted the request at least once and re-prefilled it."""
    cut_short: bool = False
    """Fewer output ids than Expectations.max_new_tokens (read for a `length` finish)."""


def inspect_record(
    input_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: Any,
    completion_tokens: int | None,
    has_tools: bool,
    expect: Expectations,
    num_retractions: int | None = 0,
) -> frozenset[str]:
    """The flags one record raises; an empty set means the record looks faithful."""
    facts = record_facts(input_ids, output_ids, finish_reason, completion_tokens, has_tools, expect, num_retractions)
    return flags_of(facts, expect)


def record_facts(
    input_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: Any,
    completion_tokens: int | None,
    has_tools: bool,
    expect: Expectations,
    num_retractions: int | None = 0,
) -> RecordFacts:
    """The facts of one record, looked up only where `flags_of` will read them (this runs on every record)."""
    facts = _id_facts(input_ids, output_ids, finish_reason, completion_tokens, has_tools, expect)
    short = expect.max_new_tokens is not None and len(output_ids) < expect.max_new_tokens
    if num_retractions or short:
        return facts._replace(retracted=bool(num_retractions), cut_short=short)
    return facts


def _id_facts(
    input_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: Any,
    completion_tokens: int | None,
    has_tools: bool,
    expect: Expectations,
) -> RecordFacts:
    kind = finish_type(finish_reason)
    nan = kind == "stop" and stop_matched_no_token(finish_reason)
    mismatch = completion_tokens is not None and len(output_ids) != completion_tokens
    leak = mismatch and _leaks_prompt_suffix(
        input_ids, output_ids, len(output_ids) - (completion_tokens or 0), expect.suffix_leak_window
    )
    stop_last = bool(output_ids) and output_ids[-1] in expect.stop_token_ids
    unbalanced = (
        has_tools
        and kind == "stop"
        and any(output_ids.count(begin) != output_ids.count(end) for begin, end in expect.tool_marker_pairs)
    )
    end_id, opener = expect.think_end_id, expect.think_start_ids
    if end_id is None:
        return RecordFacts(kind, mismatch, leak, stop_last, tool_calls_unbalanced=unbalanced, stop_not_token=nan)
    if not expect.thinking:
        opener_found = _find_seq(output_ids, opener) >= 0
        end_found = _find(output_ids, end_id) >= 0
        return RecordFacts(
            kind, mismatch, leak, stop_last, opener_in_output=opener_found, think_end_in_output=end_found,
            tool_calls_unbalanced=unbalanced, stop_not_token=nan,
        )  # fmt: skip
    closes = prompt_closes_think(input_ids, expect)
    starts_in_prompt = not opener or prompt_opens_think(input_ids, expect)
    opened_at = -1 if starts_in_prompt else _find_seq(output_ids, opener)
    if not starts_in_prompt and opened_at < 0:
        return RecordFacts(
            kind, mismatch, leak, stop_last, False, closes, False, _find(output_ids, end_id) >= 0,
            tool_calls_unbalanced=unbalanced, stop_not_token=nan,
        )  # fmt: skip
    reasoning_from = 0 if starts_in_prompt else opened_at + len(opener)
    end_at = _find(output_ids, end_id, reasoning_from)
    reasoning = NO_THINK_END_FOUND if end_at < 0 else EMPTY if end_at - reasoning_from <= 0 else WRITTEN
    return RecordFacts(
        kind, mismatch, leak, stop_last, starts_in_prompt, closes, opened_at >= 0, end_at >= 0, reasoning, unbalanced,
        nan,
    )  # fmt: skip


def flags_of(facts: RecordFacts, expect: Expectations) -> frozenset[str]:
    """The flags a record with these facts raises: every per-record rule, in one place."""
    flags: set[str] = set()
    kind = facts.kind
    if kind == "abort":
        flags.add(ABORTED)
    if facts.count_mismatch:
        flags.add(TOKEN_COUNT_MISMATCH)
        if facts.suffix_leak:
            flags.add(PROMPT_SUFFIX_LEAK)
    if ends_truncated(kind):
        flags.add(TRUNCATED)
        if facts.cut_short:
            flags.add(TRUNCATED_BY_MEMORY)
    elif kind == "stop" and not facts.ends_with_stop:
        flags.add(BAD_TERMINATION)
    if kind == "stop" and facts.stop_not_token:
        flags.add(NAN_REPLACED)
    if expect.think_end_id is not None:
        _reasoning_flags(facts, expect, flags)
    if facts.tool_calls_unbalanced and kind == "stop" and expect.tool_marker_pairs:
        flags.add(UNBALANCED_TOOL_CALLS)
    if facts.retracted and expect.restarted_by_retraction:
        flags.add(RETRACTED)
    return frozenset(flags)


def _reasoning_flags(facts: RecordFacts, expect: Expectations, flags: set[str]) -> None:
    if not expect.thinking:
        # The prompt already closed an empty think block: any think tag in the output is reasoning
        # the run did not ask for (the template and the model disagree).
        if facts.think_end_in_output or facts.opener_in_output:
            flags.add(UNEXPECTED_REASONING)
        return
    if facts.prompt_closes_think:
        flags.add(PROMPT_CLOSES_THINK)
    # The opener is either at the end of the prompt (the template prefills it) or written by the model.
    if not facts.reasoning_starts_in_prompt and not facts.opener_in_output:
        # No opener anywhere: the model did not think (a cut answer may simply not have reached it).
        if facts.kind != "length" or facts.think_end_in_output:
            flags.add(NO_THINK_START)
        return
    if facts.reasoning == NO_THINK_END_FOUND:
        # A truncated answer may stop inside the reasoning: that is truncation, not a missing closer.
        if facts.kind != "length":
            flags.add(NO_THINK_END)
    elif facts.reasoning == EMPTY:
        flags.add(EMPTY_REASONING)


def _find(ids: Sequence[int], token: int | None, start: int = 0, stop: int | None = None) -> int:
    """Index of `token` in ids[start:stop], or -1; one C-level scan, no copy (this runs on every record)."""
    if token is None:
        return -1
    try:
        return ids.index(token, start, len(ids) if stop is None else stop)
    except ValueError:
        return -1


def _find_seq(ids: Sequence[int], seq: tuple[int, ...], stop: int | None = None) -> int:
    """Index of the id sequence `seq` in ids[:stop], or -1."""
    if not seq:
        return -1
    at = _find(ids, seq[0], 0, stop)
    while at >= 0 and tuple(ids[at : at + len(seq)]) != seq:
        at = _find(ids, seq[0], at + 1, stop)
    return at


def tail_end(ids: Sequence[int], end: int, skip: frozenset[int]) -> int:
    while end > 0 and ids[end - 1] in skip:
        end -= 1
    return end


def _ends_with(ids: Sequence[int], end: int, seq: tuple[int, ...]) -> bool:
    return bool(seq) and end >= len(seq) and tuple(ids[end - len(seq) : end]) == seq


def prompt_opens_think(input_ids: Sequence[int], expect: Expectations) -> bool:
    """The rendered prompt ends with the think opener, whitespace tokens after it allowed."""
    return _ends_with(
        input_ids, tail_end(input_ids, len(input_ids), expect.prompt_tail_skip_ids), expect.think_start_ids
    )


def prompt_closes_think(input_ids: Sequence[int], expect: Expectations) -> bool:
    """The rendered prompt ends with an empty think block (`<think></think>`, `<think>\n\n</think>\n\n`)."""
    if expect.think_end_id is None:
        return False
    end = tail_end(input_ids, len(input_ids), expect.prompt_tail_skip_ids)
    if end == 0 or input_ids[end - 1] != expect.think_end_id:
        return False
    return _ends_with(input_ids, tail_end(input_ids, end - 1, expect.prompt_tail_skip_ids), expect.think_start_ids)
