"""`datagen verify` accounts prompts the worker set aside (malformed lines, invalid tools, unrenderable, too
long): completeness passes, the report lists each cause with its count, nothing asks for a rerun."""

from __future__ import annotations

from datagen_operator.checks.completeness import COMPLETENESS, account_set_aside
from tests.checks.set_aside_output import verify_produced

EXPECTED_CAUSES = {"bad_json": 1, "duplicate_id": 1, "invalid_tools": 1, "too_long": 1, "unrenderable": 1}


def test_set_aside_prompts_pass_completeness_and_are_listed_by_cause(produced) -> None:
    document, dataset, output = produced
    report = verify_produced(document, dataset, output)
    checks = {c.name: c for c in report.checks}
    completeness = checks[COMPLETENESS]
    assert completeness.passed, completeness.verdict
    assert "rerun" not in completeness.verdict
    assert completeness.verdict.startswith("every dataset id has its records exactly once: 12/16 (")
    assert "set aside unsent: 1 bad_json, 1 duplicate_id, 1 invalid_tools, 1 too_long, 1 unrenderable" in (
        completeness.verdict
    )
    assert report.set_aside == EXPECTED_CAUSES and report.as_json()["set_aside"] == EXPECTED_CAUSES
    # Not server errors: the server refused nothing.
    assert checks["server_errors"].passed and not checks["server_errors"].count
    # 3/11 lines malformed and 1/11 duplicate: from 11 lines neither is shown above its limit; nothing fails.
    assert [c.name for c in report.checks if not c.passed] == [], [c.verdict for c in report.checks]


def test_without_the_dataset_causes_come_from_the_rejects(produced) -> None:
    document, _, output = produced
    document = {**document, "dataset": {"path": str(output / "absent.jsonl")}}
    report = verify_produced(document, None, output)
    assert report.set_aside == EXPECTED_CAUSES


def test_account_set_aside_matches_entries_to_their_own_line() -> None:
    rejects = [
        {"key": "line:4", "kind": "malformed", "cause": "duplicate_id", "line": 4, "id": "a"},
        {"key": "line:2", "kind": "too_long", "cause": "too_long", "line": 2, "id": "b"},
        {"key": "record:c#0", "kind": "server", "line": 3, "id": "c", "sample": 0, "status": 400},
    ]
    aside = account_set_aside([(0, "a"), (2, "b"), (3, "c")], ["duplicate_id"], rejects)
    assert aside.prompts == {"b": "too_long"}  # "a" is the kept first occurrence; "c" is a server reject
    assert aside.causes == {"duplicate_id": 1, "too_long": 1}
