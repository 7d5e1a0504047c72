"""The lean render path (template + variables + `tokenizers`, no transformers) against the reference
(`apply_chat_template(tokenize=True)`): identical ids over the stand-ins and the example dataset, a helper
that imports no transformers, and differences caught, counted and answered with the reference."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.engine.template_tools import template_tools
from datagen_operator.prompts import render
from datagen_operator.prompts.lean_render import LeanRenderer, LeanSpec
from datagen_operator.prompts.render import (
    GENERIC_THINKING_SWITCHES,
    FullSpec,
    Renderer,
    RenderItem,
    RenderPool,
    ids_from_result,
    lean_spec,
    load_tokenizer,
)
from datagen_operator.tokenizer.families import FAMILIES
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.worker.helper_probe import loaded_modules
from tests.worker.simrun import TOOLS, prompts

REPO = Path(__file__).resolve().parents[2]
Chat = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def _items(chats: list[Chat]) -> list[RenderItem]:
    """What the pool renders: each chat with no template variables of its own."""
    return [(messages, tools, None) for messages, tools in chats]


def _chats() -> list[Chat]:
    """The example dataset, the worker tests' prompts (tools on every third) and a multi-turn tool conversation
    with reasoning and the `null` fields an API returns."""
    lines = (REPO / "examples/prompts/quickstart.jsonl").read_text().splitlines()
    chats: list[Chat] = [(row["messages"], row.get("tools")) for row in map(json.loads, lines)]
    chats += [(item["messages"], item.get("tools")) for item in prompts(24, tools_every=3)]
    call = {"id": "functions.get_weather:0", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    chats.append((
        [{"role": "system", "content": "Be brief.", "name": None},
         {"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "Let me check.", "reasoning_content": "I need the tool.", "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C"},
         {"role": "assistant", "content": "18C.", "tool_calls": None, "reasoning": None},
         {"role": "user", "content": "And Lyon?"}],
        TOOLS,
    ))  # fmt: skip
    return chats


def _renderer(family: str, thinking: bool) -> tuple[Renderer, Path]:
    directory = ensure_standin_tokenizer(family=family)
    switches = dict.fromkeys(GENERIC_THINKING_SWITCHES, thinking)
    return Renderer(load_tokenizer(directory, trust_remote_code=False), switches), directory


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lean_ids_are_the_reference_ids(family: str, thinking: bool) -> None:
    """Inline (the worker's backend) and as a helper loads it (tokenizer.json), every chat, every family."""
    renderer, directory = _renderer(family, thinking)
    spec = lean_spec(renderer, directory)
    assert isinstance(spec, LeanSpec), spec
    helper = LeanRenderer.from_spec(spec)
    assert renderer.lean is not None
    chats = _chats()
    for messages, tools in chats:
        expected = renderer.reference(messages, tools)
        assert helper.render(messages, tools) == expected
        assert renderer.render(messages, tools) == expected
    assert renderer.fast_path_mismatch is None
    assert renderer.checked == Renderer.CHECK_FIRST  # the first 16 of the inline renders, no more


def test_an_inline_difference_is_caught_counted_and_answered_with_the_reference() -> None:
    renderer, _ = _renderer("kimi-k2", True)
    assert renderer.lean is not None
    encode = renderer.lean.encode
    renderer.lean.encode = lambda text: [*encode(text), 0]  # a lean encoder that adds a token
    chats = _chats()[:5]
    assert [renderer.render(m, t) for m, t in chats] == [renderer.reference(m, t) for m, t in chats]
    assert renderer.checked == 1  # caught on the first, then the reference only
    assert renderer.fast_path_mismatch is not None and renderer.fast_path_mismatch.startswith("prompt #1:")


def _pool(renderer: Renderer, directory: Path) -> RenderPool:
    pool = RenderPool(renderer.variables, directory, False, processes=1)
    pool.renderer = renderer
    pool._start_helpers("test")
    for ready in pool._ready:  # rendering waits for no helper: let it load, so the batches go to it
        ready.result(timeout=120)
    return pool


def test_a_lean_helper_imports_no_transformers_and_its_ids_are_checked() -> None:
    renderer, directory = _renderer("kimi-k2", True)
    pool = _pool(renderer, directory)
    try:
        assert isinstance(pool.helper_spec, LeanSpec)
        modules = pool.executor.submit(loaded_modules).result(timeout=60)
        assert "tokenizers" in modules and "jinja2" in modules
        heavy = [name for name in modules if name.split(".")[0] in {"transformers", "pydantic", "torch", "numpy"}]
        assert not heavy
        chats = _chats()
        results = asyncio.run(pool.render(_items(chats)))
        assert [ids_from_result(r) for r in results] == [renderer.reference(m, t) for m, t in chats]  # type: ignore[arg-type]
        assert pool.helper_rendered == len(chats) and renderer.checked == Renderer.CHECK_FIRST
        assert renderer.rendered == 0 and renderer.fast_path_mismatch is None  # nothing rendered inline
        # The worker's own check finds the lean path wrong: the lean helpers are stopped, not used again.
        renderer.fast_path_mismatch = "prompt #1: lean ids differ from apply_chat_template"
        again = asyncio.run(pool.render(_items(chats[:3])))
        assert pool.executor is None and pool.helper_rendered == len(chats) and renderer.rendered == 3
        assert [ids_from_result(r) for r in again] == [renderer.reference(m, t) for m, t in chats[:3]]  # type: ignore[arg-type]
    finally:
        pool.close()


def test_a_helper_difference_is_caught_counted_and_the_helpers_switch_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helpers render with other template variables than the worker's reference (thinking off)."""
    renderer, directory = _renderer("kimi-k2", True)
    spec = lean_spec(renderer, directory)
    assert isinstance(spec, LeanSpec)
    wrong = replace(spec, variables={**spec.variables, **dict.fromkeys(GENERIC_THINKING_SWITCHES, False)})
    monkeypatch.setattr(render, "lean_spec", lambda renderer, directory: wrong)
    pool = _pool(renderer, directory)
    try:
        chats = _chats()[:6]
        expected = [renderer.reference(m, t) for m, t in chats]
        first = asyncio.run(pool.render(_items(chats)))
        assert [ids_from_result(r) for r in first] == expected  # type: ignore[arg-type]  # the batch re-rendered
        assert renderer.checked == 1 and renderer.fast_path_mismatch is not None
        assert renderer.fast_path_mismatch.startswith("helper prompt #1:")
        assert pool.executor is None  # the lean helpers are stopped
        pool._start_helpers("test again")  # what the next start loads: transformers, the reference only
        assert pool.helper_spec == FullSpec(str(directory), False, pool.variables, reference_only=True)
        pool._ready[0].result(timeout=120)
        chats = _chats()[6:12]
        again = asyncio.run(pool.render(_items(chats)))
        assert [ids_from_result(r) for r in again] == [renderer.reference(m, t) for m, t in chats]  # type: ignore[arg-type]
        assert pool.executor is not None and renderer.rendered == 0  # these helpers are kept
    finally:
        pool.close()


def test_a_tokenizer_that_overrides_apply_chat_template_renders_every_prompt_through_it() -> None:
    """Recent Kimi releases' remote code sorts the tools (and writes them as TypeScript) in its own
    `apply_chat_template`, which SGLang's chat endpoint calls: the template rendered around it differs on exactly
    the prompts with tools. Past the sample the lean path is checked on (the first 16, every 256th) such a prompt
    would be sent as the template renders it; so no prompt of such a tokenizer is rendered around it."""
    tokenizer = load_tokenizer(ensure_standin_tokenizer(family="qwen3"), trust_remote_code=False)

    class SortsTools(type(tokenizer)):  # type: ignore[misc]
        def apply_chat_template(self, conversation: Any, tools: Any = None, **kwargs: Any) -> Any:
            ordered = sorted(tools, key=lambda tool: tool["function"]["name"]) if tools else tools
            return super().apply_chat_template(conversation, tools=ordered, **kwargs)

    tokenizer.__class__ = SortsTools
    renderer = Renderer(tokenizer, {"enable_thinking": True})
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
        for name in ("zoom_map", "add_pin")
    ]
    plain = [([{"role": "user", "content": f"question {k}"}], None) for k in range(Renderer.CHECK_FIRST)]
    with_tools = [([{"role": "user", "content": f"where is {city}?"}], tools) for city in ("Paris", "Rome")]
    for messages, declared in [*plain, *with_tools]:
        own = tokenizer.apply_chat_template(
            messages, tools=template_tools(declared), add_generation_prompt=True, tokenize=True, return_dict=False,
            enable_thinking=True,
        )  # fmt: skip
        assert renderer.render(messages, declared) == own
    assert renderer.lean is None and renderer.rendered == Renderer.CHECK_FIRST + 2
    assert renderer.render(*with_tools[0]) != LeanRenderer(
        renderer.template, render.lean_variables(tokenizer, renderer.variables), render.backend_encoder(tokenizer)
    ).render(*with_tools[0])  # rendered around it, the tools would come in the dataset's order
