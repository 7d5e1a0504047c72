from __future__ import annotations

from pathlib import Path

import pytest

from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.worker.volume import small_volume  # noqa: F401 (a size-limited filesystem for full-volume tests)


@pytest.fixture(scope="session")
def standin() -> Path:
    return ensure_standin_tokenizer()
