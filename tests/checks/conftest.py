"""Fixtures of the checks tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.checks.set_aside_output import produce


@pytest.fixture(scope="session")
def produced(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    """A worker output over 6 good prompts and one of each set-aside cause, on a 600-token context."""
    return produce(tmp_path_factory.mktemp("set-aside"))
