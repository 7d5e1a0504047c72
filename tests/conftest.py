from pathlib import Path

import pytest

pytest_plugins = ["tests.harness.cluster_fixtures"]


@pytest.fixture(scope="session")
def standin_tokenizer() -> Path:
    """The Kimi-K2-format stand-in tokenizer's directory (tokenizer files, chat template, a config.json saying
    deepseek_v3 as the real Kimi-K2.5 checkpoint does), built once before any test or server needs it, so no two
    race to build it."""
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    return ensure_standin_tokenizer()
