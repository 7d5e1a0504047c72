"""/v1/chat/completions: the launch-time reasoning and tool-call parsers, as SGLang applies them."""

from __future__ import annotations

from typing import Any

from tests.harness.sim import SimServer
from tests.sim.http import post
from tests.sim.prompts import WEATHER_TOOL

HELLO = [{"role": "user", "content": "Hello, how are you?"}]


def chat(sim: SimServer, messages: list[dict[str, Any]] = HELLO, **fields: Any) -> dict[str, Any]:
    reply = post(sim.url, "/v1/chat/completions", {"model": "kimi", "messages": messages, **fields})
    assert reply.status == 200, reply.body[:500]
    return reply.json()


def message(response: dict[str, Any]) -> dict[str, Any]:
    return response["choices"][0]["message"]


def test_kimi_k2_parser_separates_reasoning_from_content(sim: SimServer) -> None:
    response = chat(sim)
    msg = message(response)
    assert msg["reasoning_content"] and msg["content"]
    assert "think>" not in msg["reasoning_content"] + msg["content"]
    assert response["choices"][0]["finish_reason"] == "stop"
    usage = response["usage"]
    assert 0 < usage["reasoning_tokens"] < usage["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_thinking_off_gives_no_reasoning(sim: SimServer) -> None:
    response = chat(sim, chat_template_kwargs={"thinking": False})
    assert message(response)["reasoning_content"] is None and message(response)["content"]
    assert response["usage"]["reasoning_tokens"] == 0


def test_without_reasoning_parser_the_thinking_stays_in_content(fleet: dict[str, SimServer]) -> None:
    response = chat(fleet["no_parser"])
    msg = message(response)
    assert msg["reasoning_content"] is None and response["usage"]["reasoning_tokens"] == 0
    assert msg["content"].count("</think>") == 1 and "<think>" not in msg["content"]


def test_kimi_parser_finds_nothing_in_think_tag_output(fleet: dict[str, SimServer]) -> None:
    msg = message(chat(fleet["kimi"]))
    assert msg["reasoning_content"] is None and "</think>" in msg["content"]


def test_qwen3_parser_splits_think_tags_when_the_prompt_opened_think(fleet: dict[str, SimServer]) -> None:
    msg = message(chat(fleet["qwen3"]))
    assert msg["reasoning_content"] and msg["content"] and "</think>" not in msg["content"]


def test_deepseek_r1_parser_assumes_output_starts_inside_reasoning(fleet: dict[str, SimServer]) -> None:
    thinking = message(chat(fleet["deepseek_r1"]))
    assert thinking["reasoning_content"] and thinking["content"]
    # Thinking off: no </think> in the output, so the whole answer is taken for reasoning (upstream quirk).
    off = message(chat(fleet["deepseek_r1"], chat_template_kwargs={"thinking": False}))
    assert off["reasoning_content"] and off["content"] == ""  # SGLang sends "" for no content


def test_tool_calls_are_parsed_by_the_kimi_k2_tool_parser(sim: SimServer) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    response = chat(sim, messages, tools=[WEATHER_TOOL])
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == "functions.get_weather:0" and call["type"] == "function"
    assert call["function"]["name"] == "get_weather" and '"city"' in call["function"]["arguments"]
    assert "<|tool_call" not in (choice["message"]["content"] or "")
    assert choice["message"]["reasoning_content"]


def test_tool_call_section_before_think_end_ends_kimi_k2_reasoning(fleet: dict[str, SimServer]) -> None:
    # A model that never writes </think> but calls a tool: the section still ends the reasoning.
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    choice = chat(fleet["never_close_think"], messages, tools=[WEATHER_TOOL])["choices"][0]
    assert choice["message"]["reasoning_content"]
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_multi_turn_tool_conversation_renders_and_answers(sim: SimServer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C, sunny"},
    ]
    response = chat(sim, messages, tools=[WEATHER_TOOL], max_tokens=20)
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["usage"]["completion_tokens"] == 20


def test_max_tokens_and_stop(sim: SimServer) -> None:
    assert chat(sim, max_tokens=7)["usage"]["completion_tokens"] == 7
    assert chat(sim, max_completion_tokens=5)["usage"]["completion_tokens"] == 5


def test_streaming_deltas_concatenate_to_the_message(sim: SimServer) -> None:
    plain = message(chat(sim, temperature=0))  # greedy: the streamed request is answered alike
    reply = post(sim.url, "/v1/chat/completions", {"messages": HELLO, "temperature": 0, "stream": True,
                                                  "stream_options": {"include_usage": True}})  # fmt: skip
    events = reply.events()
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == plain["reasoning_content"]
    assert "".join(delta.get("content", "") for delta in deltas) == plain["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_bad_chat_requests_are_400(sim: SimServer) -> None:
    for body in ({"messages": []}, {"messages": "hi"}, {"messages": HELLO, "max_tokens": -1}):
        reply = post(sim.url, "/v1/chat/completions", body)
        assert reply.status == 400 and reply.json()["object"] == "error"


def test_separate_reasoning_endpoint(sim: SimServer) -> None:
    reply = post(sim.url, "/separate_reasoning", {"text": "<think>plan</think> answer", "reasoning_parser": "qwen3"})
    assert reply.json() == {"text": " answer", "reasoning_text": "plan"}  # SGLang strips neither part


def test_text_content_parts_are_joined_as_sglangs_chat_endpoint_joins_them(sim: SimServer) -> None:
    # The stand-in's Kimi-K2 template is string-format: SGLang hands it the parts' text joined with a space.
    # (The template alone would write them back to back: "rainrain...", far fewer tokens.)
    parts = [{"type": "text", "text": "rain"}] * 12
    with_parts = chat(sim, [{"role": "system", "content": parts[:2]}, {"role": "user", "content": parts}])
    joined = chat(
        sim, [{"role": "system", "content": "rain rain"}, {"role": "user", "content": " ".join(["rain"] * 12)}]
    )
    assert with_parts["usage"]["prompt_tokens"] == joined["usage"]["prompt_tokens"]


def test_tool_parameter_type_names_are_rewritten_as_sglangs_request_validation_rewrites_them(sim: SimServer) -> None:
    # SGLang's _validate_request rewrites "dict", "str", "int" in place before the template renders the tool.
    def tool(object_type: str, string_type: str, integer_type: str) -> dict[str, Any]:
        properties = {name: {"type": string_type} for name in ("city", "country", "street")}
        parameters = {"type": object_type, "properties": {**properties, "days": {"type": integer_type}}}
        return {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}

    named = chat(sim, HELLO, tools=[tool("dict", "str", "int")], max_tokens=1)
    standard = chat(sim, HELLO, tools=[tool("object", "string", "integer")], max_tokens=1)
    assert named["usage"]["prompt_tokens"] == standard["usage"]["prompt_tokens"]
