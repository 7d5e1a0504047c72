"""Spec errors that name the field and the fix."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


@dataclass(frozen=True)
class FieldError:
    field: str
    """Dotted path in the manifest, e.g. spec.server.tensorParallel."""
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """One or more invalid fields in a DataGenRun."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def field_errors(error: ValidationError, prefix: str = "") -> list[FieldError]:
    """pydantic's errors as FieldErrors with camelCase paths (locations come from the aliases)."""
    out: list[FieldError] = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"] if not str(part).startswith("function-")]
        path = ".".join([prefix, *loc] if prefix else loc)
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling (fields are camelCase)"
        out.append(FieldError(path or "(root)", message))
    return out
