"""A chat prompt rendered to input_ids without transformers: the template text, its variables and an encoder.

The worker renders inline with it (over its own tokenizer's backend: the Jinja part costs ~1.4x less than
`apply_chat_template(tokenize=False)` on the stand-in), and a render helper process holds nothing else (the
template, Jinja and a `tokenizers.Tokenizer` read from tokenizer.json: no transformers import, ~60 MB less
than a transformers tokenizer). What it renders is held to `apply_chat_template(tokenize=True)` by the
worker's reference checks (`render.Renderer`), never trusted on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datagen_operator.engine.chat_content import content_format, template_messages
from datagen_operator.engine.template_tools import template_tools
from datagen_operator.tokenizer.chat_template import compile_template, render_chat

Encoder = Callable[[str], list[int]]
"""Rendered prompt text to ids, as `apply_chat_template(tokenize=True)` tokenizes it."""


class RenderError(ValueError):
    """A prompt the chat template cannot render (bad roles, bad tool schema): set aside, not retried."""


def tokenizers_encoder(backend: Any) -> Encoder:
    """A `tokenizers.Tokenizer`'s encoder as apply_chat_template calls it: `add_special_tokens=False`, so no
    BOS or post-processor tokens are added (the template writes every control token itself)."""
    return lambda text: backend.encode(text, add_special_tokens=False).ids


@dataclass(frozen=True)
class LeanSpec:
    """What a render helper loads, pickled to it: file paths and plain data, no tokenizer object."""

    chat_template: str
    variables: dict[str, Any]
    """Everything apply_chat_template gives the template besides the chat: the tokenizer's special tokens
    (`special_tokens_map`) overridden by the run's variables (the thinking switch)."""
    tokenizer_json: Path


class LeanRenderer:
    """`render` gives the ids of `apply_chat_template(messages, tools=tools, add_generation_prompt=True,
    tokenize=True, **variables)` for templates and encoders that behave as transformers' do (checked by
    the caller, not here). A template Jinja cannot compile fails here, once, not per prompt."""

    def __init__(self, chat_template: str, variables: dict[str, Any], encode: Encoder) -> None:
        compile_template(chat_template)
        self.chat_template = chat_template
        self.content_format = content_format(chat_template)
        self.variables = variables
        self.encode = encode

    @classmethod
    def from_spec(cls, spec: LeanSpec) -> LeanRenderer:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(spec.tokenizer_json))
        return cls(spec.chat_template, spec.variables, tokenizers_encoder(backend))

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        variables: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """`variables`: a line's own template variables (its chat_template_kwargs), over the run's; `tools` as the
        dataset has them (the template gets SGLang's dump of them, engine/template_tools.py)."""
        merged = {**self.variables, **variables} if variables else self.variables
        try:
            text = render_chat(
                self.chat_template,
                template_messages(messages, self.content_format),
                tools=template_tools(tools),  # as SGLang dumps them for the template
                add_generation_prompt=True,
                **merged,
            )
        except Exception as error:  # jinja errors, template `raise_exception`, bad tool schemas
            raise RenderError(f"chat template failed: {type(error).__name__}: {error}") from None
        return self.encode(text)
