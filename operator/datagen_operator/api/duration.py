"""Go-style durations (`45m`, `1h30m`, `90s`, `500ms`) as a pydantic type that keeps its spelling."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|h|m|s))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(value: str | int | float) -> float:
    """Seconds in a Go-style duration; a bare number is seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a string like '45m' or '90s', not a boolean")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return float(value)
    text = value.strip()
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{value!r} is not a duration; write it like '45m', '1h30m', '90s' or '500ms'")
    return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of whole seconds (fractions fall back to ms)."""
    if seconds != int(seconds):
        return f"{round(seconds * 1000)}ms"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return "".join(parts) or "0s"


def _validate(value: Any) -> float:
    # A bare number is refused (as by the CRD's string pattern): 3600 could mean seconds or milliseconds.
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a duration; write it as a string with a unit, like '45m' or '90s'")
    return parse_duration(value)


Duration = Annotated[
    float,
    BeforeValidator(_validate),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]
"""Seconds in Python; a Go-style string in YAML, JSON and the CRD schema."""
