"""Prompts rendered to input_ids with the model's own tokenizer and chat template.

The rendered prompt, not the server, decides whether the model thinks (kimi-k2-format.md): the
template's thinking switch is passed here, and the ids go to /generate as they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datagen_operator.api.resolve import ResolvedModel

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner per worker

# Variables a template may read when no preset names the switch; unused variables are ignored by Jinja.
GENERIC_THINKING_SWITCHES = ("thinking", "enable_thinking")


class RenderError(ValueError):
    """A prompt the chat template cannot render (bad roles, bad tool schema): set aside, not retried."""


def template_variables(resolved: ResolvedModel) -> dict[str, Any]:
    """Extra chat-template variables that switch thinking on or off for this run."""
    preset = resolved.preset
    if preset is not None:
        switch = preset.thinking.switch
        return {switch: resolved.thinking} if switch else {}
    return dict.fromkeys(GENERIC_THINKING_SWITCHES, resolved.thinking)


def load_tokenizer(tokenizer_dir: str | Path, *, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code, local_files_only=True)


class Renderer:
    def __init__(self, tokenizer: Any, resolved: ResolvedModel) -> None:
        self.tokenizer = tokenizer
        self.variables = template_variables(resolved)
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise RenderError("the tokenizer has no chat template; pre-tokenized prompts need the model's own template")

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self.variables,
            )
        except Exception as error:  # jinja errors, template `raise_exception`, bad tool schemas
            raise RenderError(f"chat template failed: {type(error).__name__}: {error}") from None
        if ids and isinstance(ids[0], list):  # some tokenizers wrap a single conversation
            ids = ids[0]
        return list(ids)
