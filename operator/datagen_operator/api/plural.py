"""Counts in the words a person reads: "1 line", "2 lines". One helper, so no message says "1 user turns"."""

from __future__ import annotations


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """`count` and its noun: singular for exactly one, else `plural_noun` (default: `noun` + "s")."""
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"
