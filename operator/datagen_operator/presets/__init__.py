"""Model-family presets: the single place that knows which SGLang flags and tokens a model needs."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenRef(_Frozen):
    """A special token by its text and, where the vocabulary fixes it, its id."""

    text: str
    id: int | None = None


class ThinkingBehaviour(_Frozen):
    supported: bool
    default: bool
    switch: str | None
    """The chat-template variable that turns thinking on or off; None when the model cannot switch."""
    prompt_prefills_opener: bool
    """True when the rendered generation prompt ends with the think opener (so outputs hold only the closer)."""


class Preset(_Frozen):
    name: str
    description: str
    family: str
    """The model family (tokenizer/families.py): vocabulary, chat format, and the stand-in tokenizer tests use."""
    standin_layout: Literal["tokenizer-json", "kimi-tiktoken"] = "tokenizer-json"
    """How the real model directory ships its tokenizer: `kimi-tiktoken` is tiktoken.model plus remote code
    (tokenizer/kimi_tiktoken.py builds that shape), so runs exercise the real loading path."""
    reasoning_parser: str | None
    tool_call_parser: str | None
    reasoning_format: Literal["think-tags", "harmony", "none"]
    think_start: TokenRef | None
    think_end: TokenRef | None
    thinking: ThinkingBehaviour
    stop_tokens: tuple[TokenRef, ...]
    tool_call_markers: tuple[tuple[TokenRef, TokenRef], ...]
    trust_remote_code: bool
    mla: bool = False
    """Multi-head latent attention (the DeepSeek-V3 architecture): with plain tensor parallelism every rank
    holds the whole latent KV cache, so serving guides raise concurrency with attention data parallelism
    (server.attentionDataParallel = tensorParallel)."""
    sources: tuple[str, ...]


@cache
def presets() -> dict[str, Preset]:
    """All presets by name, read once from presets.yaml."""
    raw = yaml.safe_load(resources.files(__package__).joinpath("presets.yaml").read_text(encoding="utf-8"))
    return {name: Preset(name=name, **body) for name, body in raw.items()}


def preset_names() -> list[str]:
    return sorted(presets())


def get_preset(name: str) -> Preset:
    try:
        return presets()[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}") from None
