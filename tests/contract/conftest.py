"""SGLang's own code for the contract tests, loaded once per session from the pinned wheel.

SGLang runs in ONE child process (spawned, so it starts clean), not in the pytest process: loading it
installs import stubs for torch and friends and patches transformers globally, which would leak into every
later test of the session (the simulator tests load tokenizers through transformers). Tests call the
functions of `sglang_side` in that process through the `sglang` fixture; arguments and results are plain data.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.contract import sglang_side
from tests.contract.wheel import sglang_wheel, unpacked_sglang

CALL_TIMEOUT_S = 120


class SGLang:
    """A handle on the child process that holds SGLang: `call(sglang_side.f, ...)` runs `f` there."""

    def __init__(self, pool: ProcessPoolExecutor, model_dir: Path) -> None:
        self._pool = pool
        self.model_dir = model_dir

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._pool.submit(function, *args, **kwargs).result(timeout=CALL_TIMEOUT_S)


@pytest.fixture(scope="session")
def sglang_wheel_path() -> Path:
    return sglang_wheel()


@pytest.fixture(scope="session")
def sglang(standin_tokenizer: Path) -> Iterator[SGLang]:
    source = unpacked_sglang()
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=sglang_side.load,
        initargs=(str(source), str(standin_tokenizer)),
    )
    try:
        yield SGLang(pool, standin_tokenizer)
    finally:
        pool.shutdown(cancel_futures=True)
