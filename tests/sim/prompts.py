"""Pre-tokenized Kimi-K2 prompts for the simulator tests, rendered with the stand-in's chat template."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from tokenizers import Tokenizer

from datagen_operator.tokenizer import kimi_tokens
from datagen_operator.tokenizer.chat_template import kimi_k2_chat_template, render_chat
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

THINK = kimi_tokens.THINK.id
THINK_END = kimi_tokens.THINK_END.id
IM_END = kimi_tokens.IM_END.id

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}


@cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(ensure_standin_tokenizer() / "tokenizer.json"))


def encode(text: str) -> list[int]:
    return list(tokenizer().encode(text, add_special_tokens=False).ids)


def decode(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return str(tokenizer().decode(list(ids), skip_special_tokens=skip_special_tokens))


def chat_prompt(
    question: str = "What is 2 + 2?", *, thinking: bool = True, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return encode(render_chat(kimi_k2_chat_template(), messages, tools=tools, thinking=thinking))
