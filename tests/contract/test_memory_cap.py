"""engine.limits.memory_cap is SGLang 0.5.23's own cap of a request's new tokens to its KV pool
(`BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`): the simulator caps its answers with it
(`--sim-kv-capacity`), and an answer it cuts ends `length` short of max_new_tokens (`truncated_by_memory`)."""

from __future__ import annotations

import pytest

from datagen_operator.engine.limits import memory_cap
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

CASES = [
    (30, 4096, 400, 1),  # the pool binds
    (30, 50, 400, 1),  # max_new_tokens binds
    (30, 4096, 400, 64),  # the prompt rounded up to a page, one page kept
    (64, 4096, 400, 64),  # a prompt of whole pages
    (399, 4096, 400, 1),  # nothing left
    (1000, 16, 400, 16),  # a prompt over the pool: 0, never negative
    (0, 8, 8, 1),
]


@pytest.mark.parametrize(("input_tokens", "max_new_tokens", "capacity", "page_size"), CASES)
def test_the_memory_cap_is_sglangs(
    sglang: SGLang, input_tokens: int, max_new_tokens: int, capacity: int, page_size: int
) -> None:
    theirs = sglang.call(sglang_side.max_new_tokens_for_memory, input_tokens, max_new_tokens, capacity, page_size)
    assert memory_cap(input_tokens, max_new_tokens, capacity, page_size) == theirs
