"""Spec errors that name the field and the fix."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

CROSS_FIELD = "cross_field"
"""The error type of a rule between fields, reported at one field (see cross_field_error)."""

UNKNOWN_FIELD = "unknown field"
"""How every unknown-field message starts."""
_UNKNOWN_FIELD_HINTS = {
    "max_tokens": f"{UNKNOWN_FIELD}: max_tokens is OpenAI's name and SGLang 0.5.23 rejects it; write max_new_tokens",
}


@dataclass(frozen=True)
class FieldError:
    field: str
    """Path in the manifest as the API server writes it, e.g. spec.server.tensorParallel, spec.server.env[0]."""
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """One or more invalid fields in a DataGenRun."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def cross_field_error(field: str, message: str) -> PydanticCustomError:
    """Raised by a model validator whose rule spans fields: reported at `field` (camelCase, relative to
    the model), the field the CRD's CEL rule names with its fieldPath, not at the model itself."""
    return PydanticCustomError(CROSS_FIELD, message, {"cross_field": field})


def field_path(parts: list[str | int]) -> str:
    """spec.server.env[0].name: list indices in brackets, as the API server writes them."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def field_errors(error: ValidationError, prefix: str = "") -> list[FieldError]:
    """pydantic's errors as FieldErrors with the wire's paths (locations come from the aliases)."""
    out: list[FieldError] = []
    for item in error.errors():
        loc: list[str | int] = [part for part in item["loc"] if not str(part).startswith("function-")]
        if prefix:
            loc.insert(0, prefix)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == CROSS_FIELD:
            loc.append(item["ctx"]["cross_field"])
        elif item["type"] == "extra_forbidden":
            message = _UNKNOWN_FIELD_HINTS.get(
                str(loc[-1]),
                f"{UNKNOWN_FIELD}; remove it or check its spelling (spec fields are camelCase; only "
                "generation.sampling uses SGLang's snake_case names)",
            )
        out.append(FieldError(field_path(loc) or "(root)", message))
    return out
