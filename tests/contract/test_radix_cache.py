"""The simulator's radix cache against SGLang's `RadixCache`, run (tests/contract/sglang_cache_side.py): the same
requests (prompt matched at admission, prompt + output inserted at finish, LRU eviction under the pool) give the
same `cached_tokens` and the same tree size after every finish, at page sizes 1, 4 and 16.

SGLang's tree needs torch: the child takes it from the consumers' venv (`make test-consumers`); without that
venv this file is skipped (tests/sim/test_prefix_cache.py holds the behaviour read from the code without it)."""

from __future__ import annotations

import multiprocessing
import os
import random
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.engine.sim.prefix_cache import Hold, RadixCache
from tests.contract import sglang_cache_side
from tests.contract.wheel import unpacked_sglang

CONSUMERS_VENV = Path(os.environ.get("CONSUMERS_VENV") or Path.home() / ".cache" / "datagen" / "consumers-venv")
SITE_PACKAGES = CONSUMERS_VENV / "lib" / "python3.11" / "site-packages"


@pytest.fixture(scope="module")
def sglang_tree() -> Iterator[ProcessPoolExecutor]:
    if not (SITE_PACKAGES / "torch" / "__init__.py").exists():
        pytest.skip(f"SGLang's RadixCache needs torch: no consumers' venv at {CONSUMERS_VENV} (make test-consumers)")
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=sglang_cache_side.load,
        initargs=(str(unpacked_sglang()), str(SITE_PACKAGES)),
    )
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def ours(events: list[list[Any]], capacity: int, page_size: int) -> list[Any]:
    cache = RadixCache(capacity, page_size)
    running: dict[str, tuple[Hold, list[int]]] = {}
    answers: list[Any] = []
    for event in events:
        if event[0] == "admit":
            hold = cache.admit(event[2])
            running[event[1]] = (hold, event[2])
            answers.append(hold.cached)
        elif event[0] == "finish":
            hold, prompt = running.pop(event[1])
            cache.finish(hold, prompt, event[2])
            answers.append(cache.total_size)
        elif event[0] == "match":
            answers.append(cache.match(event[1])[0])
        else:
            cache.flush()
            answers.append(cache.total_size)
    return answers


def conversations(seed: int, count: int, turns: int, concurrent: int) -> list[list[Any]]:
    """Multi-turn chats (each turn's prompt is the last prompt, its answer and a new user message), some sharing
    a system prompt, `concurrent` of them interleaved; answers of 1-40 tokens from a small vocabulary so
    prefixes collide by chance too."""
    rng = random.Random(seed)
    systems = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(3)]
    pending: list[tuple[str, list[int], int]] = []
    events: list[list[Any]] = []
    started = 0
    while started < count or pending:
        while started < count and len(pending) < concurrent:
            prompt = [*rng.choice(systems), *(rng.randrange(50) for _ in range(rng.randrange(1, 20)))]
            rid = f"c{started}"
            events.append(["admit", f"{rid}.0", prompt])
            pending.append((rid, prompt, 0))
            started += 1
        rid, prompt, turn = pending.pop(rng.randrange(len(pending)))
        output = [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
        events.append(["finish", f"{rid}.{turn}", output])
        if rng.random() < 0.1:
            events.append(["match", prompt[: rng.randrange(1, len(prompt) + 1)]])
        if turn + 1 < turns:
            prompt = [*prompt, *output, *(rng.randrange(50) for _ in range(rng.randrange(1, 10)))]
            events.append(["admit", f"{rid}.{turn + 1}", prompt])
            pending.append((rid, prompt, turn + 1))
    return events


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize(("capacity", "seed"), [(100_000, 1), (600, 2), (250, 3)])
def test_same_cached_tokens_and_tree_as_sglang(
    sglang_tree: ProcessPoolExecutor, capacity: int, seed: int, page_size: int
) -> None:
    events = conversations(seed, count=40, turns=4, concurrent=6)
    events.append(["flush"])
    theirs = sglang_tree.submit(sglang_cache_side.replay, events, capacity, page_size).result(timeout=300)
    mine = ours(events, capacity, page_size)
    admits = [i for i, e in enumerate(events) if e[0] == "admit"]
    assert sum(theirs[i] for i in admits) > 0  # the sequences do reuse prefixes
    assert mine == theirs
