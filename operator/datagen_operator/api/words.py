"""Counts and turns in the words a person reads, each rule in one place: "1 line", "2 lines"; "turn 1" for the
answer to a conversation's first user turn, whose records hold `turn` 0 (the stored column counts from 0, as the
worker's keys do; a person counts from 1 everywhere they read one: reports, the HTML legend, rejects' reasons)."""

from __future__ import annotations

TURNS_COUNTED = "turns are counted from 1: turn 1 is the records' `turn` 0"
"""Said beside a person's turn numbers where the stored column is in view (the HTML report's length plots)."""


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """`count` and its noun: singular for exactly one, else `plural_noun` (default: `noun` + "s")."""
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"


def agrees(count: int, singular_verb: str, plural_verb: str) -> str:
    """The verb that agrees with `count` of a noun: agrees(1, "passes", "pass") is "passes"."""
    return singular_verb if count == 1 else plural_verb


def turn_label(turn: int) -> str:
    """A record's stored `turn` (from 0) as a person counts it: 'turn 1'."""
    return f"turn {turn + 1}"
