"""spec.export: the trainer formats written once the final verification passes, and which records they leave out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, Field, WithJsonSchema

from datagen_operator.api.flags import ALL_FLAGS, unknown_flags_problem
from datagen_operator.api.spec_base import SUB_PATH_PATTERN, SpecModel


def _record_flag(value: str) -> str:
    problem = unknown_flags_problem([value])
    if problem is not None:
        raise ValueError(problem)
    return value


RecordFlag = Annotated[str, AfterValidator(_record_flag), WithJsonSchema({"type": "string", "enum": list(ALL_FLAGS)})]
"""One of the record flags (api/flags.py): the CRD holds them as an enum, `datagen validate` names the wrong one."""


ExportFormat = Literal["speculators", "trl", "text", "conversations"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
"""The trainer formats `datagen export` writes: the spec's enum and the CLI's choices."""


class ExportSpec(SpecModel):
    formats: list[ExportFormat] = Field(
        min_length=1,
        max_length=4,
        description="Trainer formats to write once the final verification passes (conversations: the regenerated "
        "conversations as text, generation.turns all).",
    )
    rows: Literal["turns", "conversations"] = Field(
        default="turns",
        description="turns: a row per recorded turn; conversations (generation.turns all): a row per whole "
        "conversation, the loss over every answer it holds verbatim (docs/export.md).",
    )
    rerendered_spans: Literal["unmasked", "drop-row"] = Field(
        default="unmasked",
        description="A conversation row holding an earlier answer the template re-rendered: keep that span unmasked "
        "(counted) or leave the conversation out (counted).",
    )
    path: str = Field(
        default="export",
        pattern=SUB_PATH_PATTERN,
        max_length=253,
        description="Folder inside the run's output directory; each format goes to PATH/<format>.",
    )
    max_length: int | None = Field(default=None, ge=1, description="Rows longer than this are left out.")
    exclude_flags: list[RecordFlag] = Field(
        default_factory=list, max_length=32, description="Record flags to leave out, e.g. truncated."
    )


def whole_conversations_asked(rows: str, formats: Iterable[str]) -> bool:
    """Whole conversations are exported (read against the dataset's planned turns, generation.turns all): a row per
    conversation (rows: conversations) or the conversations format. The export, its Job and its CLI ask this."""
    return rows == "conversations" or "conversations" in formats
