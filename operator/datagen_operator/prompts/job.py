"""What one request makes: the `Job` (a rendered prompt, its sample and, for a conversation, its turn), and the
`Conversation` a Job carries through its turns (generation.turns all). The worker makes them (worker/turn_maker.py),
the record store builds its records and rejects from them (output/records.py), the preflight sizes records with
them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datagen_operator.prompts.conversation import AnswerSplit, Turns


@dataclass(slots=True)
class Conversation:
    """A conversation being regenerated (generation.turns all): its turns, tools and the model's answers so far.
    One lane holds it from its first turn to be sent to its last, so its turns go out in order."""

    turns: Turns
    tools: list[dict[str, Any]] | None
    answers: list[AnswerSplit]
    variables: dict[str, Any] | None = None
    """The line's own chat_template_kwargs, rendered into every turn."""


@dataclass(frozen=True, slots=True)
class Job:
    """One record to make: a rendered prompt, a sample index and, for a conversation, its turn."""

    position: int
    id: str
    sample: int
    input_ids: list[int]
    has_tools: bool
    prompt_hash: int
    """prompts.pin.prompt_hash of the dataset line the prompt was read from: verify checks it against the pin."""
    turn: int = 0
    conversation: Conversation | None = None
    thinking: bool | None = None
    """The line's own thinking switch (its chat_template_kwargs), when it sets one: its record is judged by it."""
    source_fields: str | None = None
    """The line's other fields, JSON text (prompts.lines.source_fields): every turn's record carries them."""
