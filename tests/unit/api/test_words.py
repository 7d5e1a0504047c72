"""Counts and turns as a person reads them: one rule each (api/words.py)."""

from __future__ import annotations

from datagen_operator.api.words import agrees, plural, turn_label


def test_a_count_of_one_takes_the_singular() -> None:
    assert [plural(n, "user turn") for n in (0, 1, 2)] == ["0 user turns", "1 user turn", "2 user turns"]
    assert plural(1, "process", "processes") == "1 process" and plural(3, "process", "processes") == "3 processes"
    assert f"{plural(1, 'check')} {agrees(1, 'passes', 'pass')}" == "1 check passes"
    assert f"{plural(9, 'check')} {agrees(9, 'passes', 'pass')}" == "9 checks pass"


def test_a_person_counts_turns_from_one() -> None:
    assert turn_label(0) == "turn 1"
