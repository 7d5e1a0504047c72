"""How each family writes a tool call and how SGLang reads it (engine/tool_calls.py `TOOL_CALL_PARSERS`), held to
SGLang 0.5.23's own function-call parsers: for every preset, the family's calls (as its model writes them) and the
answers that only look like calls are read by SGLang's FunctionCallParser and by ours, which must find the same
calls and leave the same normal text; the opener each parser looks for and the stop ids the detokenizer keeps for
it are SGLang's."""

from __future__ import annotations

import json
import random

import pytest

from datagen_operator.engine.sim.formats import ToolCall, write_tool_calls
from datagen_operator.engine.sim.model import example_arguments
from datagen_operator.engine.tool_calls import GPT_OSS_CALL_ID, TOOL_CALL_PARSERS, read_tool_calls, stop_kept
from datagen_operator.presets import get_preset, preset_names
from datagen_operator.prompts.conversation import AnswerSplitter
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.tokenizer.families import get_family
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name} of a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"],
    }}}
    for name in ("get_weather", "get_time")
]  # fmt: skip
TOOL_PRESETS = [name for name in preset_names() if get_preset(name).tool_call_parser]


def _answers(preset: str) -> dict[str, str]:
    """The answers to read: calls as the family writes them (first in the output, after other text, two of them,
    to an undeclared tool, with arguments that are no JSON) and answers with no call."""
    chat = get_family(get_preset(preset).family).chat
    rng = random.Random(7)
    weather = ToolCall("get_weather", example_arguments(rng, TOOLS[0]["function"]["parameters"]))
    time = ToolCall("get_time", {"city": "Paris", "days": 2})
    reasoning = "<|channel|>analysis<|message|>The user wants the weather.<|end|>" if chat.tool_call_format == (
        "harmony"
    ) else ""  # fmt: skip
    call = write_tool_calls(chat, [weather], first=not reasoning)
    answers = {
        "call": reasoning + call,
        "call after text": (reasoning or "Let me look that up.") + write_tool_calls(chat, [weather], first=False),
        "two calls": reasoning + write_tool_calls(chat, [weather, time], first=not reasoning),
        "undeclared tool": reasoning + write_tool_calls(chat, [ToolCall("get_stock", {"x": 1})], first=not reasoning),
        "arguments no JSON": reasoning
        + call.replace(json.dumps(weather.arguments, ensure_ascii=False), "{city: Paris"),
        "plain answer": "It is sunny in Paris.",
        "harmony final": "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.",
    }
    if chat.tool_call_format == "harmony":
        answers["call first"] = write_tool_calls(chat, [weather], first=True)
    return {name: text + ("<|call|>" if chat.tool_call_format == "harmony" and "call" in name else "")
            for name, text in answers.items()}  # fmt: skip


CASES = [(preset, answer) for preset in TOOL_PRESETS for answer in _answers(preset)]


@pytest.mark.parametrize(("preset", "answer"), CASES)
def test_our_reading_of_a_tool_call_is_sglangs(sglang: SGLang, preset: str, answer: str) -> None:
    parser = get_preset(preset).tool_call_parser
    assert parser is not None
    text = _answers(preset)[answer]
    theirs = sglang.call(sglang_side.tool_call_parse, parser, TOOLS, text)
    ours = read_tool_calls(parser, text, TOOLS)
    assert ours.found is theirs["found"] is (TOOL_CALL_PARSERS[parser].opener in text)
    assert ours.normal_text == theirs["normal_text"]
    assert [{"name": call.name, "arguments": json.loads(call.arguments)} for call in ours.calls] == [
        {"name": call["name"], "arguments": json.loads(call["arguments"])} for call in theirs["calls"]
    ]


@pytest.mark.parametrize("preset", TOOL_PRESETS)
def test_every_family_s_call_is_a_call_sglang_parses(sglang: SGLang, preset: str) -> None:
    """The family's own call (as its model writes it and the simulator plays it) is one: the table's format is
    the family's, and SGLang's parser returns it."""
    definition = get_preset(preset)
    parser = definition.tool_call_parser
    assert parser is not None
    assert TOOL_CALL_PARSERS[parser].format == get_family(definition.family).chat.tool_call_format
    theirs = sglang.call(sglang_side.tool_call_parse, parser, TOOLS, _answers(preset)["call"])
    assert [call["name"] for call in theirs["calls"]] == ["get_weather"]


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_PARSERS))
def test_each_parser_s_opener_is_the_one_sglang_looks_for(sglang: SGLang, parser: str) -> None:
    assert TOOL_CALL_PARSERS[parser].opener == sglang.call(sglang_side.tool_call_opener, parser)


@pytest.mark.parametrize("preset", preset_names())
def test_the_stop_ids_kept_for_the_tool_parser_are_the_detokenizers(sglang: SGLang, preset: str) -> None:
    """gpt-oss's `<|call|>` stays at the end of a call under the gpt-oss parser; every other stop id is trimmed."""
    definition = get_preset(preset)
    model_dir = ensure_standin_tokenizer(family=definition.family)
    stops = [token.id for token in definition.stop_tokens if token.id is not None]
    parser = definition.tool_call_parser
    theirs = sglang.call(sglang_side.kept_stop_ids, str(model_dir), definition.trust_remote_code, parser, stops)
    assert [stop for stop in stops if stop_kept(parser, stop)] == theirs
    assert theirs == ([200012] if parser == "gpt-oss" else [])


@pytest.mark.parametrize(("preset", "answer"), CASES)
def test_the_runs_split_of_each_answer_is_the_chat_endpoints_message(sglang: SGLang, preset: str, answer: str) -> None:
    """The answers as output ids (the family's stand-in tokenizer; a stop id after them unless the call's own
    `<|call|>` ends them): SGLang's detokenizer trim, reasoning parser and tool-call parser, as serving_chat runs
    them, give the message the run's AnswerSplitter records (content, reasoning, calls)."""
    definition = get_preset(preset)
    model_dir = ensure_standin_tokenizer(family=definition.family)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=definition.trust_remote_code)
    ids = list(tokenizer.encode(_answers(preset)[answer], add_special_tokens=False))
    if ids[-1] != GPT_OSS_CALL_ID:
        ids.append(next(token.id for token in definition.stop_tokens if token.id is not None))
    finish_reason = {"type": "stop", "matched": ids[-1]}
    switch = definition.thinking.switch
    kwargs = {switch: definition.thinking.default} if switch else {}
    text = sglang.call(
        sglang_side.chat_output_text, model_dir=str(model_dir), trust_remote_code=definition.trust_remote_code,
        tool_call_parser=definition.tool_call_parser, output_ids=ids, finish_reason=finish_reason,
        skip_special_tokens=False,
    )  # fmt: skip
    theirs = sglang.call(
        sglang_side.chat_split, reasoning_parser=definition.reasoning_parser,
        tool_call_parser=definition.tool_call_parser, chat_template=tokenizer.chat_template,
        chat_template_kwargs=kwargs or None, tools=TOOLS, text=text,
    )  # fmt: skip
    splitter = AnswerSplitter(
        tokenizer, definition.reasoning_parser, tokenizer.chat_template, kwargs, definition.tool_call_parser
    )
    ours = splitter.split(ids, finish_reason, True, None, TOOLS)
    assert (ours.content, ours.reasoning_content or None) == (theirs["content"], theirs["reasoning_content"])
    assert [{"name": call.name, "arguments": json.loads(call.arguments)} for call in ours.tool_calls] == [
        {"name": call["name"], "arguments": json.loads(call["arguments"])} for call in theirs["tool_calls"]
    ]
