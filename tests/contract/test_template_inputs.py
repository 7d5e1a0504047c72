"""What the chat template gets behind SGLang's chat endpoint, held to SGLang 0.5.23's own message processing
(`OpenAIServingChat._process_messages` run in the sglang child process: sglang_side.template_inputs):

- tools: SGLang's `Tool.model_dump()` of each, `"defer_loading": null` included, and the prompts this project
  renders hold exactly that (engine/template_tools.py);
- history: an earlier assistant message's reasoning_content reaches the template as the client sent it, and not
  at all when the client left it out, so generation.historyReasoning is the client's choice SGLang honours."""

from __future__ import annotations

import json
from typing import Any

import pytest

from datagen_operator.engine.template_tools import template_tools
from datagen_operator.prompts.conversation import AnswerSplit, plan_turns, turn_messages
from datagen_operator.prompts.render import Renderer, load_tokenizer
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather for a city", "parameters": SCHEMA},
    },
    {"type": "function", "function": {"parameters": SCHEMA, "name": "parameters_first"}},
    {"type": "function", "function": {"name": "ping"}},
    {
        "type": "function",
        "function": {"name": "strict_one", "strict": True, "x-vendor": 1, "description": "unknown keys go"},
        "defer_loading": True,
    },
    {"type": "function", "function": {"description": "d", "name": "deferred", "defer_loading": False}, "cache": "no"},
]
USER = {"role": "user", "content": "Weather in Paris?"}


def _in_order(value: Any) -> str:
    """JSON with keys in their order: templates render a dict in its order, so the order is compared too."""
    return json.dumps(value)


def test_the_tools_a_template_gets_are_sglangs_dump_of_them(sglang: SGLang) -> None:
    seen = sglang.call(sglang_side.template_inputs, {"model": "m", "messages": [USER], "tools": TOOLS})
    assert _in_order(template_tools(TOOLS)) == _in_order(seen["tools"])
    assert all("defer_loading" in tool for tool in seen["tools"])  # null or not: every tool the template sees


def test_a_prompt_with_tools_is_what_sglang_hands_the_model_template(sglang: SGLang) -> None:
    """Qwen3's template writes each tool as JSON: our prompt holds SGLang's dump, `"defer_loading": null` in
    each tool declaration (the dataset's tools never say it), token for token."""
    tools = TOOLS[:3]
    messages = [{"role": "system", "content": "Be brief."}, USER]
    seen = sglang.call(sglang_side.template_inputs, {"model": "m", "messages": messages, "tools": tools})
    tokenizer = load_tokenizer(ensure_standin_tokenizer(family="qwen3"), trust_remote_code=False)
    renderer = Renderer(tokenizer, {"enable_thinking": True})
    behind_sglang = tokenizer.apply_chat_template(
        seen["messages"],
        tools=seen["tools"],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        enable_thinking=True,
    )
    for _ in range(Renderer.CHECK_FIRST + 1):  # the lean path too, once it is no longer checked
        assert renderer.render(messages, tools) == list(behind_sglang)
    assert tokenizer.decode(behind_sglang).count('"defer_loading": null') == len(tools)


@pytest.mark.parametrize("history_reasoning", ["keep", "drop"])
def test_earlier_reasoning_reaches_the_template_as_the_client_sends_it(sglang: SGLang, history_reasoning: str) -> None:
    turns = plan_turns([USER, {"role": "assistant", "content": "x"}, {"role": "user", "content": "And Rome?"}])
    messages = turn_messages(turns, 1, [AnswerSplit("Rain.", "Look it up.")], history_reasoning=history_reasoning)  # type: ignore[arg-type]
    seen = sglang.call(sglang_side.template_inputs, {"model": "m", "messages": messages})
    assert seen["messages"] == messages
    assert ("reasoning_content" in seen["messages"][1]) is (history_reasoning == "keep")
