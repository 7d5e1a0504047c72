"""SGLang's own reasoning parser and function-call detector split the simulator's raw output as the
simulator's chat endpoint does, for every preset.

For each preset a simulator speaks the preset's family with the preset's parsers. A prompt is sent twice:
to `/v1/chat/completions` (the simulator's split) and, rendered with the model's template as the workers do,
to `/generate` with the same budget and seed (the raw output ids; the simulators run with
--enable-deterministic-inference, without which SGLang ignores the seed and samples each request anew). SGLang's detokenizer trims and decodes
the ids as its chat endpoint has them decoded (special tokens kept when tools are declared or for gpt-oss),
and SGLang's parsers split the text as `serving_chat` runs them (tests/contract/sglang_side.py). The run's own
split of the ids (prompts/conversation.py `AnswerSplitter`: a regenerated answer's history and its tool calls) is
held to the same message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.presets import Preset, get_preset, preset_names
from datagen_operator.prompts.conversation import AnswerSplitter
from datagen_operator.prompts.render import Renderer, load_tokenizer
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.contract import sglang_side
from tests.contract.conftest import SGLang
from tests.harness.sim import SimServer
from tests.sim.http import post

BUDGET = 1024
SEEDS = (1, 2)
SHORT = ("--sim-mean-answer-tokens", "40", "--sim-mean-reasoning-tokens", "60")
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "plain": ([{"role": "user", "content": "Is 221 a prime number?"}], None),
    "tools": ([{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER_TOOL]),
}


def _thinking_modes(preset: Preset) -> list[bool]:
    """Both modes where the template has a switch; otherwise the preset's only mode."""
    return [True, False] if preset.thinking.switch else [preset.thinking.default]


# The Kimi misbehaviours the gate must catch, as the simulator plays them: the split of such output is what
# the parser probe judges, so it too must be SGLang's.
MISCONFIG_PRESET = "kimi-k2.5"
MISCONFIGS = ("never-close-think", "ignore-thinking")


def _sim_flags(preset: Preset, misconfig: str | None) -> list[str]:
    # Seeds are honoured only under deterministic inference: the two requests of a prompt then agree.
    flags = ["--sim-family", preset.family, "--sim-tool-call-rate", "1", "--enable-deterministic-inference", *SHORT]
    flags += ["--sim-misconfig", misconfig] if misconfig else []
    for flag, value in (
        ("--reasoning-parser", preset.reasoning_parser),
        ("--tool-call-parser", preset.tool_call_parser),
    ):
        if value:
            flags += [flag, value]
    return flags


@pytest.fixture(scope="module")
def preset_sim() -> Iterator[Any]:
    """One simulator per preset (and per Kimi misbehaviour), all spawned at once so their start-ups overlap;
    a test waits only for its own. A preset whose stand-in cannot be built fails its own tests."""
    wanted = [(name, None) for name in preset_names()] + [(MISCONFIG_PRESET, m) for m in MISCONFIGS]
    entries: dict[tuple[str, str | None], dict[str, Any] | Exception] = {}
    for name, misconfig in wanted:
        preset = get_preset(name)
        try:
            model_dir = ensure_standin_tokenizer(family=preset.family)
        except (KeyError, OSError) as error:
            entries[(name, misconfig)] = error
            continue
        server = SimServer(_sim_flags(preset, misconfig), tokenizer_dir=model_dir)
        server.spawn()
        entries[(name, misconfig)] = {"server": server, "model_dir": model_dir, "preset": preset}

    def ready(name: str, misconfig: str | None = None) -> dict[str, Any]:
        entry = entries[(name, misconfig)]
        if isinstance(entry, Exception):
            raise entry
        if "tokenizer" not in entry:
            entry["server"].wait_ready(timeout_s=120)
            entry["tokenizer"] = load_tokenizer(entry["model_dir"], trust_remote_code=entry["preset"].trust_remote_code)
        return entry

    try:
        yield ready
    finally:
        servers = [entry["server"] for entry in entries.values() if isinstance(entry, dict)]
        for server in servers:  # signal all first: they shut down in parallel
            server.terminate()
        for server in servers:
            server.stop()


def _simulator_message(server: SimServer, body: dict[str, Any]) -> dict[str, Any]:
    reply = post(server.url, "/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    message = reply.json()["choices"][0]["message"]
    calls = [
        {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        for call in message.get("tool_calls") or []
    ]
    return {"reasoning_content": message.get("reasoning_content"), "content": message.get("content"),
            "tool_calls": calls}  # fmt: skip


def _raw_output(server: SimServer, input_ids: list[int], seed: int) -> tuple[list[int], dict[str, Any]]:
    params = {"max_new_tokens": BUDGET, "sampling_seed": seed}
    reply = post(server.url, "/generate", {"input_ids": input_ids, "sampling_params": params})
    assert reply.status == 200, reply.body
    result = reply.json()
    return result["output_ids"], result["meta_info"]["finish_reason"]


def _arguments(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments compared as JSON values (both sides serialise them as JSON text)."""
    return [{**call, "arguments": json.loads(call["arguments"])} for call in calls]


CASES = [
    (preset, conversation, thinking)
    for preset in preset_names()
    for conversation in CONVERSATIONS
    for thinking in _thinking_modes(get_preset(preset))
]


@pytest.mark.parametrize(("preset", "conversation", "thinking"), CASES)
def test_simulator_splits_chat_output_as_sglangs_parsers_do(
    sglang: SGLang, preset_sim: Any, preset: str, conversation: str, thinking: bool
) -> None:
    _assert_same_split(sglang, preset_sim(preset), preset, conversation, thinking)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("misconfig", MISCONFIGS)
def test_misbehaving_output_is_split_as_sglang_splits_it(
    sglang: SGLang, preset_sim: Any, misconfig: str, conversation: str
) -> None:
    _assert_same_split(sglang, preset_sim(MISCONFIG_PRESET, misconfig), MISCONFIG_PRESET, conversation, True)


def _assert_same_split(sglang: SGLang, entry: dict[str, Any], preset: str, conversation: str, thinking: bool) -> None:
    definition = get_preset(preset)
    server, tokenizer, model_dir = entry["server"], entry["tokenizer"], Path(entry["model_dir"])
    messages, tools = CONVERSATIONS[conversation]
    switch = definition.thinking.switch
    template_kwargs = {switch: thinking} if switch else {}
    input_ids = Renderer(tokenizer, template_kwargs).render(messages, tools)
    keep_special = bool(tools) or definition.family == "gpt-oss"
    for seed in SEEDS:
        body = {"model": "m", "messages": messages, "max_tokens": BUDGET, "seed": seed,
                "chat_template_kwargs": template_kwargs} | ({"tools": tools} if tools else {})  # fmt: skip
        simulated = _simulator_message(server, body)
        output_ids, finish_reason = _raw_output(server, input_ids, seed)
        text = sglang.call(
            sglang_side.chat_output_text,
            model_dir=str(model_dir),
            trust_remote_code=definition.trust_remote_code,
            tool_call_parser=definition.tool_call_parser,
            output_ids=output_ids,
            finish_reason=finish_reason,
            skip_special_tokens=not keep_special,
        )
        expected = sglang.call(
            sglang_side.chat_split,
            reasoning_parser=definition.reasoning_parser,
            tool_call_parser=definition.tool_call_parser,
            chat_template=tokenizer.chat_template,
            chat_template_kwargs=template_kwargs or None,
            tools=tools,
            text=text,
        )
        assert {**simulated, "tool_calls": _arguments(simulated["tool_calls"])} == {
            **expected,
            "tool_calls": _arguments(expected["tool_calls"]),
        }, f"seed {seed}, model {model_dir.name}, raw output: {text!r}"
        # The run's own split of the same ids (the history of a regenerated conversation, and the calls that end
        # it) is the chat endpoint's message too.
        splitter = AnswerSplitter(
            tokenizer,
            definition.reasoning_parser,
            tokenizer.chat_template,
            template_kwargs,
            definition.tool_call_parser,
        )
        ours = splitter.split(output_ids, finish_reason, bool(tools), None, tools or ())
        calls = [{"name": call.name, "arguments": call.arguments} for call in ours.tool_calls]
        assert {"reasoning_content": ours.reasoning_content or None, "content": ours.content,
                "tool_calls": _arguments(calls)} == {**expected, "tool_calls": _arguments(expected["tool_calls"])}, (
            f"seed {seed}, model {model_dir.name}, raw output: {text!r}"
        )  # fmt: skip
