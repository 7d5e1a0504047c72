"""The turn rules of prompts/conversation.py: which turns a conversation gets, what each turn's prompt holds, and how
an answer becomes the next turn's history (the stop trimmed, special tokens as SGLang's chat endpoint decodes them,
reasoning split by the preset's parser)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from datagen_operator.engine.tool_calls import ParsedCall
from datagen_operator.prompts.conversation import (
    AnswerSplit,
    AnswerSplitter,
    calls_tool,
    client_messages,
    dataset_answers,
    last_turn,
    plan_turns,
    planned_turns,
    request_messages,
    turn_messages,
)


def _m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_every_user_turn_is_planned_and_the_datasets_answers_are_dropped() -> None:
    messages = [
        _m("system", "be brief"),
        _m("user", "q1"),
        _m("assistant", "original a1"),
        _m("user", "q2"),
        _m("assistant", "original a2"),
        _m("user", "q3"),
    ]
    turns = plan_turns(messages)
    assert len(turns) == 3 and turns.cut == 0
    assert turns.inputs == ((_m("system", "be brief"), _m("user", "q1")), (_m("user", "q2"),), (_m("user", "q3"),))
    assert all(m["role"] != "assistant" for inputs in turns.inputs for m in inputs)


def test_two_user_messages_in_a_row_are_answered_once_and_a_leading_assistant_message_is_dropped() -> None:
    messages = [_m("assistant", "hello!"), _m("user", "a"), _m("user", "b"), _m("assistant", "x"), _m("user", "c")]
    turns = plan_turns(messages)
    assert turns.inputs == ((_m("user", "a"), _m("user", "b")), (_m("user", "c"),))


def test_a_conversation_is_regenerated_up_to_its_first_tool_message_and_the_rest_is_counted() -> None:
    messages = [
        _m("user", "weather in Paris?"),
        _m("assistant", "calling"),
        _m("tool", '{"forecast": "rain"}'),
        _m("assistant", "rain"),
        _m("user", "and Madrid?"),
        _m("assistant", "sun"),
        _m("user", "thanks"),
    ]
    turns = plan_turns(messages)
    assert len(turns) == 1 and turns.cut == 2
    assert planned_turns(messages, "all") == 1 and planned_turns(messages, "last") == 1


def test_no_user_message_plans_no_turn() -> None:
    assert len(plan_turns([_m("system", "s"), _m("assistant", "a")])) == 0


def test_a_turns_prompt_holds_the_models_own_earlier_answers_in_order() -> None:
    turns = plan_turns(
        [_m("user", "q1"), _m("assistant", "orig"), _m("user", "q2"), _m("assistant", "o"), _m("user", "q3")]
    )
    answers = [AnswerSplit("mine 1", "thought 1"), AnswerSplit("mine 2", None)]
    assert turn_messages(turns, 0, [], history_reasoning="keep") == [_m("user", "q1")]
    assert turn_messages(turns, 2, answers, history_reasoning="keep") == [
        _m("user", "q1"),
        {"role": "assistant", "content": "mine 1", "reasoning_content": "thought 1"},
        _m("user", "q2"),
        {"role": "assistant", "content": "mine 2"},
        _m("user", "q3"),
    ]
    with pytest.raises(ValueError, match="needs 2 earlier answers"):
        turn_messages(turns, 2, answers[:1], history_reasoning="keep")


def test_turns_last_answers_the_last_user_turn_and_drops_a_trailing_assistant_turn() -> None:
    messages = [_m("user", "q1"), _m("assistant", "a1"), _m("user", "q2"), _m("assistant", "a2")]
    assert last_turn(messages) == (messages[:3], 1)
    assert last_turn(messages[:3]) == (messages[:3], 0)
    assert request_messages(messages, "last", history_reasoning="keep") == messages[:3]
    assert request_messages(messages, "all", history_reasoning="keep") == [_m("user", "q1")]


def test_history_reasoning_drop_sends_no_assistant_message_with_its_reasoning() -> None:
    """generation.historyReasoning: `keep` sends each earlier answer as SGLang's chat endpoint returned it,
    `drop` without its reasoning_content (SpecForge's regenerate_train_data.py), with turns all (the model's own
    answers) and last (the dataset's); nothing else changes, and the caller's messages are not touched."""
    turns = plan_turns(
        [_m("user", "q1"), _m("assistant", "orig"), _m("user", "q2"), _m("assistant", "o"), _m("user", "q3")]
    )
    answers = [AnswerSplit("mine 1", "thought 1"), AnswerSplit("mine 2", "thought 2")]
    kept = turn_messages(turns, 2, answers, history_reasoning="keep")
    dropped = turn_messages(turns, 2, answers, history_reasoning="drop")
    assert [m.get("reasoning_content") for m in kept if m["role"] == "assistant"] == ["thought 1", "thought 2"]
    assert dropped == [
        _m("user", "q1"), _m("assistant", "mine 1"), _m("user", "q2"), _m("assistant", "mine 2"), _m("user", "q3")
    ]  # fmt: skip
    dataset = [
        _m("system", "s"),
        _m("user", "q1"),
        {"role": "assistant", "content": "a1", "reasoning_content": "r1", "name": "bot"},
        _m("user", "q2"),
        _m("assistant", "a2"),
    ]
    assert request_messages(dataset, "last", history_reasoning="drop") == [
        _m("system", "s"), _m("user", "q1"), {"role": "assistant", "content": "a1", "name": "bot"}, _m("user", "q2")
    ]  # fmt: skip
    assert dataset[2]["reasoning_content"] == "r1"
    assert request_messages(dataset, "last", history_reasoning="keep") == dataset[:4]
    with pytest.raises(ValueError, match="historyReasoning must be one of keep, drop"):
        client_messages(dataset, "strip")  # type: ignore[arg-type]


class _Tokenizer:
    """Decodes ids as their names; ids >= 100 are special tokens (skipped unless asked to keep them)."""

    NAMES: ClassVar[dict[int, str]] = {
        1: "<think>",
        2: "plan",
        3: "</think>",
        4: "answer",
        5: "<tool_call>",
        100: "<|im_end|>",
    }

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.NAMES[i] for i in ids if not (skip_special_tokens and i >= 100))


def test_an_answer_is_split_as_the_chat_endpoint_gives_it_to_a_client() -> None:
    splitter = AnswerSplitter(_Tokenizer(), "qwen3", None, {"enable_thinking": True})
    stop = {"type": "stop", "matched": 100}
    assert splitter.split([1, 2, 3, 4, 100], stop, has_tools=False) == AnswerSplit("answer", "plan")
    # With tools the special tokens stay in the text (serving_chat): the matched stop is still trimmed by id.
    assert splitter.split([1, 2, 3, 4, 100], stop, has_tools=True) == AnswerSplit("answer", "plan")
    # A stop matched by another id is not trimmed; an unclosed think is all reasoning.
    assert splitter.split([1, 2, 100], {"type": "stop", "matched": 7}, has_tools=True) == AnswerSplit(
        "", "plan<|im_end|>"
    )
    no_parser = AnswerSplitter(_Tokenizer(), None, None, {})
    assert no_parser.split([1, 2, 3, 4, 100], stop, has_tools=False) == AnswerSplit("<think>plan</think>answer", None)


def test_a_parser_whose_split_is_not_modelled_is_refused_for_whole_conversations() -> None:
    with pytest.raises(ValueError, match=r"use generation\.turns: last"):
        AnswerSplitter(_Tokenizer(), "step3", None, {})


def test_the_preflights_stand_in_answers_read_text_parts() -> None:
    # The dataset's own answers stand in for the model's when the preflight sizes a conversation's last turn.
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Describe rain."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Water"}, {"type": "text", "text": "falls."}]},
        {"role": "user", "content": "More?"},
    ]
    turns = plan_turns(messages)
    assert [answer.content for answer in dataset_answers(messages, turns)] == ["Water falls.", ""]


def test_a_tool_call_parser_whose_reading_is_not_modelled_is_refused_for_whole_conversations() -> None:
    with pytest.raises(ValueError, match=r"tool-call parser 'hermes'.*use generation\.turns: last"):
        AnswerSplitter(_Tokenizer(), "qwen3", None, {}, "hermes")


class _HarmonyTokenizer:
    NAMES: ClassVar[dict[int, str]] = {
        1: "<|channel|>analysis<|message|>",
        2: "Call it.",
        3: "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        4: '{"city": "Paris"}',
        5: "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        200012: "<|call|>",
    }

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.NAMES[i] for i in ids)


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_a_harmony_call_keeps_its_call_stop_and_is_split_into_the_call() -> None:
    """gpt-oss under the gpt-oss tool parser: the detokenizer keeps <|call|>, so the call is read, not dropped."""
    ids, stop = [1, 2, 3, 4, 200012], {"type": "stop", "matched": 200012}
    splitter = AnswerSplitter(_HarmonyTokenizer(), "gpt-oss", None, {}, "gpt-oss")
    split = splitter.split(ids, stop, True, None, WEATHER)
    assert split == AnswerSplit("", "Call it.", (ParsedCall("get_weather", '{"city": "Paris"}'),))
    assert calls_tool(split) and not calls_tool(AnswerSplit("", "Call it."))
    # A call to an undeclared tool parses as none (SGLang drops it), and a call before any analysis lacks the
    # message start SGLang's parser looks for (its content is the raw call): both still call, and end there.
    undeclared = splitter.split(ids, stop, True, None, [{"type": "function", "function": {"name": "other"}}])
    assert undeclared == AnswerSplit("", "Call it.") and calls_tool(undeclared)
    first = splitter.split([5, 4, 200012], stop, True, None, WEATHER)
    assert first.tool_calls == () and first.content.startswith("<|channel|>commentary") and calls_tool(first)
    # Without a tool-call parser SGLang reads no call (and its detokenizer trims <|call|>).
    assert not calls_tool(
        AnswerSplitter(_HarmonyTokenizer(), "gpt-oss", None, {}).split(ids, stop, True, None, WEATHER)
    )
