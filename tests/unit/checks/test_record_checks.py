"""Per-record raw-token checks on Kimi-K2 ids (tokenizer/kimi_tokens.py)."""

from __future__ import annotations

from datagen_operator.api.flags import (
    ABORTED,
    BAD_TERMINATION,
    EMPTY_REASONING,
    NO_THINK_END,
    NO_THINK_START,
    PROMPT_CLOSES_THINK,
    PROMPT_SUFFIX_LEAK,
    TOKEN_COUNT_MISMATCH,
    TRUNCATED,
    UNBALANCED_TOOL_CALLS,
    UNEXPECTED_REASONING,
    finish_type,
)
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.record_checks import Expectations, inspect_record

THINK, END_THINK, IM_END = 163606, 163607, 163586
SECTION_BEGIN, SECTION_END = 163595, 163596
PROMPT_THINKING = [163587, 10, 11, 163601, 12, 163586, 163588, 13, 163601, THINK]
PROMPT_NOT_THINKING = [*PROMPT_THINKING, END_THINK]
STOP = {"type": "stop", "matched": IM_END}

KIMI = Expectations(
    thinking=True,
    think_start_ids=(THINK,),
    think_end_id=END_THINK,
    stop_token_ids=frozenset({IM_END}),
    tool_marker_pairs=((SECTION_BEGIN, SECTION_END),),
    prompt_prefills_opener=True,
)


def flags(
    output: list[int], prompt: list[int] = PROMPT_THINKING, finish=STOP, completion=None, tools=False, expect=KIMI
):
    return inspect_record(prompt, output, finish, len(output) if completion is None else completion, tools, expect)


def test_faithful_thinking_record_has_no_flags() -> None:
    assert flags([1, 2, 3, END_THINK, 4, 5, IM_END]) == frozenset()


def test_opener_in_output_is_fine_when_the_template_does_not_prefill() -> None:
    assert flags([THINK, 1, 2, END_THINK, 4, IM_END], prompt=PROMPT_THINKING[:-1]) == frozenset()


def test_missing_think_end() -> None:
    assert flags([1, 2, 3, IM_END]) == {NO_THINK_END}


def test_truncated_inside_reasoning_is_truncation_only() -> None:
    assert flags([1, 2, 3], finish={"type": "length", "length": 3}) == {TRUNCATED}


def test_empty_reasoning() -> None:
    assert flags([END_THINK, 4, IM_END]) == {EMPTY_REASONING}


def test_no_opener_anywhere() -> None:
    assert flags([1, END_THINK, 4, IM_END], prompt=PROMPT_THINKING[:-1]) == {NO_THINK_START}


def test_prompt_rendered_with_thinking_off_in_a_thinking_run() -> None:
    assert flags([4, 5, IM_END], prompt=PROMPT_NOT_THINKING) == {PROMPT_CLOSES_THINK, NO_THINK_START}


def test_non_thinking_run() -> None:
    no_think = Expectations(**{**KIMI.__dict__, "thinking": False})
    assert flags([4, 5, IM_END], prompt=PROMPT_NOT_THINKING, expect=no_think) == frozenset()
    assert flags([1, END_THINK, 5, IM_END], prompt=PROMPT_NOT_THINKING, expect=no_think) == {UNEXPECTED_REASONING}


def test_token_count_mismatch_and_prompt_suffix_leak() -> None:
    leaked = [163601, THINK, 1, 2, END_THINK, 4, IM_END]  # the prompt's last two tokens leaked in front
    assert flags(leaked, completion=len(leaked) - 2) == {TOKEN_COUNT_MISMATCH, PROMPT_SUFFIX_LEAK}
    assert flags([1, END_THINK, 4, IM_END], completion=7) == {TOKEN_COUNT_MISMATCH}


def test_stop_without_stop_token_last() -> None:
    assert flags([1, END_THINK, 4, 5]) == {BAD_TERMINATION}


def test_abort() -> None:
    assert ABORTED in flags([1], finish={"type": "abort", "message": "x", "status_code": 500})


def test_unbalanced_tool_calls_only_counted_when_tools_were_offered() -> None:
    output = [1, END_THINK, SECTION_BEGIN, 9, IM_END]
    assert flags(output, tools=True) == {UNBALANCED_TOOL_CALLS}
    assert flags(output, tools=False) == frozenset()
    assert flags([1, END_THINK, SECTION_BEGIN, 9, SECTION_END, IM_END], tools=True) == frozenset()


def test_finish_reason_as_json_string_shape() -> None:
    assert finish_type({"type": "length", "length": 5}) == "length"
    assert finish_type(None) is None


# Qwen3-2507 thinking: the template ends the prompt with `<think>` and a newline token.
Q_THINK, Q_END_THINK, Q_IM_END, Q_NEWLINE = 151667, 151668, 151645, 198
QWEN_2507 = Expectations(
    thinking=True,
    think_start_ids=(Q_THINK,),
    think_end_id=Q_END_THINK,
    stop_token_ids=frozenset({Q_IM_END}),
    prompt_prefills_opener=True,
    prompt_tail_skip_ids=frozenset({Q_NEWLINE}),
)


def test_opener_followed_by_a_newline_still_counts_as_prefilled() -> None:
    prompt = [151644, 77091, Q_NEWLINE, Q_THINK, Q_NEWLINE]
    output = [5, 6, Q_END_THINK, Q_NEWLINE, 7, Q_IM_END]
    assert flags(output, prompt=prompt, expect=QWEN_2507) == frozenset()
    assert rc.prompt_opens_think(prompt, QWEN_2507)
    closed = [*prompt, Q_NEWLINE, Q_END_THINK, Q_NEWLINE, Q_NEWLINE]
    assert rc.prompt_closes_think(closed, QWEN_2507)


# gpt-oss harmony: reasoning is the analysis channel, opened by three tokens and closed by <|end|>.
CHANNEL, MESSAGE, END, START, RETURN = 200005, 200008, 200007, 200006, 200002
ANALYSIS, FINAL, ASSISTANT = 35644, 17196, 173781
HARMONY = Expectations(
    thinking=True,
    think_start_ids=(CHANNEL, ANALYSIS, MESSAGE),
    think_end_id=END,
    stop_token_ids=frozenset({RETURN, 200012}),
)
HARMONY_PROMPT = [START, 1, 2, END, START, ASSISTANT]


def test_harmony_reasoning_in_the_analysis_channel() -> None:
    faithful = [CHANNEL, ANALYSIS, MESSAGE, 5, 6, END, START, ASSISTANT, CHANNEL, FINAL, MESSAGE, 7, RETURN]
    assert flags(faithful, prompt=HARMONY_PROMPT, expect=HARMONY) == frozenset()
    no_analysis = [CHANNEL, FINAL, MESSAGE, 7, RETURN]
    assert flags(no_analysis, prompt=HARMONY_PROMPT, expect=HARMONY) == {NO_THINK_START}
    never_ended = [CHANNEL, ANALYSIS, MESSAGE, 5, 6, 7, RETURN]
    assert flags(never_ended, prompt=HARMONY_PROMPT, expect=HARMONY) == {NO_THINK_END}
    empty = [CHANNEL, ANALYSIS, MESSAGE, END, START, ASSISTANT, CHANNEL, FINAL, MESSAGE, 7, RETURN]
    assert flags(empty, prompt=HARMONY_PROMPT, expect=HARMONY) == {EMPTY_REASONING}
