"""A dataset line as the rest of the program holds it: a valid prompt's place (PromptRef), the prompt itself
(Prompt: OpenAI messages, tools, template variables), a line set aside (MalformedLine); its number and key as a
person reads them, and its fields beside the conversation (source_fields)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.engine.chat_tools import read_tools
from datagen_operator.prompts.line_shape import BAD_JSON, TEMPLATE_KWARGS, id_key, normalised_messages

if TYPE_CHECKING:
    from datagen_operator.prompts.draws import VariableDraws


@dataclass(frozen=True, slots=True)
class PromptRef:
    """One valid prompt of this shard. `position` is its 0-based line (row, JSON array element) in the dataset."""

    position: int
    id: str
    offset: int
    """Byte offset of the JSONL line or JSON array element (-1 for Parquet rows, which are kept in memory)."""
    length: int


def ref_slot_setters() -> tuple[Callable[[PromptRef, Any], None], ...]:
    """PromptRef's slot setters, in field order: the scan makes a PromptRef per line, and setting the slots
    directly costs a third of the frozen dataclass's __init__ (object.__setattr__ per field)."""
    names = tuple(field.name for field in fields(PromptRef))
    assert names == ("position", "id", "offset", "length"), names  # a new field must be set there too
    return tuple(getattr(PromptRef, name).__set__ for name in names)


@dataclass(frozen=True, slots=True)
class Prompt:
    position: int
    id: str
    messages: list[dict[str, Any]]
    """OpenAI messages, whichever shape the line had (normalised_messages)."""
    tools: list[dict[str, Any]] | None
    variables: dict[str, Any] | None = None
    """The line's chat_template_kwargs, rendered over the run's template variables."""
    source_fields: str | None = None
    """The line's other fields as JSON text (`source_fields`), where the worker read them: carried to its records."""


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A dataset line set aside: the reason, and its start for a human to find it."""

    position: int
    reason: str
    excerpt: str
    id: str | None = None
    cause: str = BAD_JSON

    @property
    def key(self) -> str:
        return line_key(self.position)


def line_number(position: int) -> int:
    """A dataset line (or JSON array element) as a person counts it: 1-based, in every message, record and
    rejects.jsonl entry (`position` stays the 0-based index inside the program)."""
    return position + 1


def line_key(position: int) -> str:
    """The rejects.jsonl key of a dataset line set aside."""
    return f"line:{line_number(position)}"


def excerpt(raw: bytes | str, limit: int = 200) -> str:
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    return text[:limit]


def prompt_from(ref: PromptRef, obj: dict[str, Any], draws: VariableDraws | None = None) -> Prompt:
    """The prompt of a valid line, from its parsed object: its messages as OpenAI messages (normalised_messages).
    `draws`: generation.templateVariableMix: the line's drawn variables are its chat_template_kwargs, under its
    own (a line's own value of a drawn variable wins)."""
    return Prompt(
        ref.position,
        ref.id,
        normalised_messages(obj),
        read_tools(obj.get("tools"))[0],
        line_variables(ref.id, obj, draws),
    )


def line_variables(prompt_id: str, obj: dict[str, Any], draws: VariableDraws | None) -> dict[str, Any] | None:
    """The chat_template_kwargs a line renders with: its drawn variables (prompts/draws.py), then its own."""
    own = obj.get(TEMPLATE_KWARGS) or None
    if draws is None:
        return own
    return {**draws.draw(prompt_id), **(own or {})}


CONVERSATION_KEYS = ("messages", "conversations", "tools")
"""What a line's conversation is read from; every other top-level key but its id is one of its `source_fields`."""


def source_fields(obj: dict[str, Any], id_field: str | None = None, drawn: dict[str, Any] | None = None) -> str | None:
    """A line's fields beside its conversation (metadata, source, category, its chat_template_kwargs...) as JSON
    text, keys in the line's order, or None when it has none: what a record carries of its line so every export
    keeps the row, as SpecForge's regeneration keeps its input row. Its id (`id_field`, default `id`) is the
    record's own; messages/conversations and tools are the prompt. A null value is kept (a Parquet column's).
    `drawn`: with generation.templateVariableMix, the chat_template_kwargs the line rendered with (line_variables:
    its draw under its own), recorded as its chat_template_kwargs, so each record says what it was drawn."""
    skipped = (*CONVERSATION_KEYS, id_key(id_field))
    fields = {key: value for key, value in obj.items() if key not in skipped}
    if drawn is not None:
        fields[TEMPLATE_KWARGS] = drawn
    return orjson.dumps(fields, default=str).decode() if fields else None
