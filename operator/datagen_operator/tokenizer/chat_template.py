"""Render a chat template the way `transformers`' `apply_chat_template` does, without importing transformers.

The simulator renders chat prompts on its hot path and must start in well under a second; importing
transformers takes seconds. This module reproduces transformers' Jinja environment (sandboxed,
`trim_blocks`, `lstrip_blocks`, loop controls, its `tojson`, `raise_exception`, `strftime_now`) and its
reasoning-field aliasing; a test compares the two on the stand-in's template.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_RESOURCE = "kimi_k2_chat_template.jinja"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def kimi_k2_chat_template() -> str:
    """The stand-in's Kimi-K2 chat template text, shipped as package data."""
    return resources.files(__package__).joinpath(TEMPLATE_RESOURCE).read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format_: str) -> str:
    return datetime.now().strftime(format_)


@cache
def compile_template(template_text: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template_text)


def _template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as transformers gives it to the template: keys whose value is None dropped (an API's
    `tool_calls: null` must not render as "None"), the reasoning under each name templates read."""
    plain = {key: value for key, value in message.items() if value is not None}
    reasoning = next((plain[key] for key in _REASONING_FIELDS if key in plain), None)
    if reasoning is None:
        return plain
    return {"thinking": reasoning, **plain, "reasoning_content": reasoning}


def render_chat(
    template_text: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **template_vars: Any,
) -> str:
    """The prompt text for `messages`, as `tokenizer.apply_chat_template(..., tokenize=False)` renders it."""
    return compile_template(template_text).render(
        messages=[_template_message(message) for message in messages],
        tools=list(tools) if tools is not None else None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **template_vars,
    )
