"""Things done once: the CheckContext builder (one constructor call in the package)."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from datagen_operator.api import parse_run, parse_spec_resolved
from datagen_operator.api.resolve import resolve_model
from datagen_operator.checks.evaluate import check_context

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "datagen_operator"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "kimi-k2.5.yaml"


def constructor_calls(name: str) -> list[str]:
    """'module:line' of every call `name(...)` in the package's source."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_check_context_is_built_in_one_place() -> None:
    calls = constructor_calls("CheckContext")
    assert len(calls) == 1 and calls[0].startswith("checks/evaluate.py:"), calls


def test_check_context_from_the_preset_or_the_tokenizer_or_the_fingerprint() -> None:
    spec = parse_run(yaml.safe_load(EXAMPLE.read_text())).spec
    resolved = resolve_model(spec)
    operator = check_context(resolved, spec.checks)  # no tokenizer: the preset's fixed id
    assert operator.thinking and operator.think_end == "</think>" and operator.preset == "kimi-k2.5"
    assert operator.think_end_id is not None
    assert check_context(resolved, spec.checks, 7).think_end_id == 7  # the tokenizer's own id wins
    alone = check_context(None, spec.checks, None, thinking=True, preset="qwen3")  # verify of an output alone
    assert (alone.thinking, alone.preset, alone.think_end, alone.think_end_id) == (True, "qwen3", None, None)


def test_parsing_a_spec_hands_back_the_model_it_resolved() -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    spec, resolved = parse_spec_resolved(document["spec"])
    assert resolved == resolve_model(spec)
