"""generation.historyReasoning, family by family: what `keep` and `drop` give in the prompt of a later turn, rendered
as the run renders it (prompts/conversation.py `request_messages`, then `prompts.render.Renderer`) with each
family's stand-in tokenizer and its published chat template (tests/real_templates.py; the project's own template
where the sdist has none: Kimi-K2.5, Qwen3-2507). docs/regenerate.md's table ("History reasoning") is held to it,
number for number, so the doc cannot claim a family drops earlier reasoning when its template keeps it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.api.generation_spec import HistoryReasoning
from datagen_operator.output.fingerprint import build_fingerprint, fingerprint_history_reasoning, prelaunch_changes
from datagen_operator.presets import presets
from datagen_operator.prompts.conversation import AnswerSplit, plan_turns, request_messages
from datagen_operator.prompts.render import Renderer, load_tokenizer
from datagen_operator.tokenizer.families import FAMILIES
from datagen_operator.tokenizer.standin import chat_template, ensure_standin_tokenizer
from tests.real_templates import real_templates

DOC = Path(__file__).resolve().parents[3] / "docs" / "regenerate.md"
PUBLISHED = {
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "kimi-k2-thinking": "Kimi-K2-Thinking.jinja",
    "glm-4.5": "GLM-4.6.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
}
PRESETS = ("qwen3", "qwen3-thinking-2507", "deepseek-r1", "kimi-k2.5", "kimi-k2-thinking", "glm-4.5", "gpt-oss")
ANSWERS = (
    AnswerSplit("Rain is water falling from clouds.", "The user asks about rain; explain briefly."),
    AnswerSplit("Snow is frozen water.", "Now snow; keep it short."),
)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


DATASET_ANSWER = {"role": "assistant", "content": "(the dataset's answer: never sent)"}
CHAT = [_user("What is rain?"), DATASET_ANSWER, _user("And snow?"), DATASET_ANSWER, _user("And hail?")]
"""Turn 3 of a chat: two earlier answers of the model in its history."""
TOOL_RESPONSE = [_user("What is rain?"), DATASET_ANSWER, _user('<tool_response>\n{"mm": 3}\n</tool_response>')]
"""A user turn shaped like a tool result after one answer (Qwen3's template reads it as no new query)."""


@dataclass(frozen=True)
class Rendered:
    keep: int
    drop: int
    kept_reasoning: tuple[int, ...]
    """The answers (1-based) whose reasoning the `keep` prompt holds and the `drop` prompt does not."""

    def cell(self) -> str:
        kept = ", ".join(map(str, self.kept_reasoning)) or "none"
        return f"{self.keep} / {self.drop} ({kept})"


@cache
def _renderer(preset: str) -> Renderer:
    family = presets()[preset].family
    tokenizer = load_tokenizer(ensure_standin_tokenizer(family=family), trust_remote_code=False)
    published = PUBLISHED.get(family)
    tokenizer.chat_template = (
        real_templates(PUBLISHED.values())[published] if published else chat_template(FAMILIES[family])
    )
    switch = presets()[preset].thinking.switch
    return Renderer(tokenizer, {switch: True} if switch else {})


def _render(preset: str, messages: list[dict[str, Any]]) -> Rendered:
    renderer = _renderer(preset)
    last = len(plan_turns(messages)) - 1
    ids: dict[HistoryReasoning, list[int]] = {}
    for choice in ("keep", "drop"):
        sent = request_messages(messages, "all", last, ANSWERS[:last], history_reasoning=choice)
        ids[choice] = renderer.render(sent, None)
    text = {choice: renderer.tokenizer.decode(found) for choice, found in ids.items()}
    kept = tuple(
        k + 1
        for k, answer in enumerate(ANSWERS[:last])
        if answer.reasoning_content in text["keep"] and answer.reasoning_content not in text["drop"]
    )
    return Rendered(len(ids["keep"]), len(ids["drop"]), kept)


def _doc_table() -> dict[str, tuple[str, str]]:
    """docs/regenerate.md's rows: preset -> (chat cell, tool_response cell)."""
    section = DOC.read_text().split("## History reasoning", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.-]+)` \| [^|]+ \| ([^|]+?) \| ([^|]+?) \|$", section, re.MULTILINE)
    return {preset: (chat, tool) for preset, chat, tool in rows}


@pytest.mark.parametrize("preset", PRESETS)
def test_the_docs_table_says_what_each_choice_gives_in_the_prompt(preset: str) -> None:
    table = _doc_table()
    assert preset in table, f"docs/regenerate.md's History reasoning table has no row for {preset}"
    assert table[preset] == (_render(preset, CHAT).cell(), _render(preset, TOOL_RESPONSE).cell())


def test_only_templates_that_keep_earlier_reasoning_make_the_choice_matter() -> None:
    """The table's claim in words: Kimi-K2-Thinking keeps the reasoning of every answer after the first, the Qwen3
    templates that of answers after the last real user query; every other family drops it, so `keep` and `drop`
    give the same ids there."""
    differ = {
        (preset, case): rendered
        for preset in PRESETS
        for case, messages in (("chat", CHAT), ("tool_response", TOOL_RESPONSE))
        if (rendered := _render(preset, messages)).keep != rendered.drop
    }
    assert {key: rendered.kept_reasoning for key, rendered in differ.items()} == {
        ("kimi-k2-thinking", "chat"): (2,),
        ("qwen3", "tool_response"): (1,),
        ("qwen3-thinking-2507", "tool_response"): (1,),
    }


def test_the_fingerprint_holds_the_choice_and_a_change_is_named() -> None:
    common: dict[str, Any] = {
        "tokenizer": {}, "chat_template": None, "server": {}, "sampling": {}, "preset": "qwen3", "thinking": True,
        "turns": "all",
    }  # fmt: skip
    keep, drop = build_fingerprint(**common), build_fingerprint(**common, history_reasoning="drop")
    assert build_fingerprint(**common, history_reasoning="keep") == keep  # outputs made before the field: unchanged
    assert prelaunch_changes(keep, drop) == ['history_reasoning: (absent) -> "drop"']
    assert prelaunch_changes(drop, keep) == ['history_reasoning: "drop" -> (absent)']
    assert (fingerprint_history_reasoning(keep), fingerprint_history_reasoning(drop)) == ("keep", "drop")
