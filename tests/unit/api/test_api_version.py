"""The API version is spelled once, in api/spec.py (ApiGroupVersion); everything else reads the constants."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from datagen_operator.api.spec import API_GROUP, API_GROUP_VERSION, API_VERSION, DataGenRun

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "operator" / "datagen_operator"
PINNED = {REPO / "tests" / "unit" / "api" / "test_crd.py"}
"""Holds the published CRD's version name to its literal on purpose: a changed constant must fail it."""


def spellings(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [word for word in (API_GROUP_VERSION, f'"{API_VERSION}"') if word in text]


def test_the_constants_are_the_models_literal() -> None:
    assert f"{API_GROUP}/{API_VERSION}" == API_GROUP_VERSION
    assert get_args(DataGenRun.model_fields["api_version"].annotation) == (API_GROUP_VERSION,)


def test_no_module_outside_api_spells_the_api_version() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if (PACKAGE / "api") not in p.parents]
    tests = [p for p in (REPO / "tests").rglob("*.py") if p not in PINNED]
    found = {str(p.relative_to(REPO)): words for p in modules + tests if (words := spellings(p))}
    assert not found, f"spell the API version through api/spec.py's constants: {found}"
