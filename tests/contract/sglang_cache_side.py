"""SGLang's own radix cache (`mem_cache/radix_cache.py` `RadixCache`), run on CPU in a child process.

The tree keeps its values in torch tensors, which the stubs of `sglang_side` cannot hold: this child puts the
real torch of the consumers' venv (`make test-consumers`, docs/testing.md: torch 2.14.1, the version SGLang
0.5.23 pins, which imports and runs on CPU) on its path and stubs only the rest (`sglang_stubs`, less torch,
torchvision and triton, which are real there). `replay` drives the tree as the scheduler does for each request
(`init_next_round_input` -> `match_prefix` capped at len-1; the prefix locked while it runs;
`release_kv_cache` -> `checkpoint` on finish; the allocator evicting when the pool is short).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

_STATE: dict[str, Any] = {}


def load(source_root: str, site_packages: str) -> None:
    sys.path.append(site_packages)  # after the project's venv: its transformers and friends stay first
    import torch  # noqa: F401  (the real one, before the stub finder exists)
    from transformers.utils import import_utils

    import_utils.is_torch_available()
    from tests.contract import sglang_stubs

    sglang_stubs.STUB_ROOTS = tuple(r for r in sglang_stubs.STUB_ROOTS if r not in {"torch", "torchvision", "triton"})
    sglang_stubs.install_stubs()
    sys.path.insert(0, source_root)
    from sglang.srt.mem_cache import base_prefix_cache, radix_cache

    _STATE["radix_cache"], _STATE["params"] = radix_cache, base_prefix_cache


class _Allocator:
    """The pool's free list, as far as the tree uses it (`free_segment` on evict, `device`)."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed = 0

    def free_segment(self, values: Any, start_pos: int = 0) -> None:
        self.freed += len(values)


def replay(events: list[list[Any]], capacity: int, page_size: int) -> list[Any]:
    """Run `events` on SGLang's RadixCache: ["admit", rid, prompt] answers the cached tokens;
    ["finish", rid, output_ids] answers the tree's size after it; ["match", tokens] answers the matched
    length (a lookup that touches, as the waiting queue's does); ["flush"] evicts everything unlocked."""
    rc, params = _STATE["radix_cache"], _STATE["params"]
    import torch

    tree = rc.RadixCache.create_simulated(mock_allocator=_Allocator(), page_size=page_size)
    running: dict[str, tuple[Any, Any, list[int], int]] = {}
    booked = 0
    answers: list[Any] = []

    def key(tokens: list[int], limit: int | None = None) -> Any:
        return rc.RadixKey(array("q", tokens), None, limit=limit)

    def fit() -> None:
        # The allocator's shortfall (`evict_to_free_tokens`): what the tree and running requests hold over the pool.
        over = tree.total_size() + booked - capacity
        if over > 0:
            tree.evict(params.EvictParams(num_tokens=over))

    for event in events:
        if event[0] == "admit":
            _, rid, prompt = event
            result = tree.match_prefix(params.MatchPrefixParams(key=key(prompt, max(len(prompt) - 1, 0))))
            lock = tree.lock(result.last_device_node)
            own = len(prompt) - result.device_prefix_len
            booked += own
            running[rid] = (lock, result, prompt, own)
            fit()
            answers.append(result.device_prefix_len)
        elif event[0] == "finish":
            _, rid, output_ids = event
            lock, _, prompt, own = running.pop(rid)
            booked -= own
            # `checkpoint`: the KV held is prompt + output less the last sampled token (`owned_kv_len`).
            tokens = prompt + output_ids[:-1]
            full = key(tokens).page_aligned(page_size)
            values = torch.arange(len(full), dtype=torch.int64)
            tree.insert(params.InsertParams(key=full, value=values, inserted_len=0, priority=0))
            prompt_key = key(prompt).page_aligned(page_size)
            if 0 < len(prompt_key) < len(full):  # `split_prompt`
                tree.insert(params.InsertParams(key=prompt_key, value=values[: len(prompt_key)], priority=1))
            new_node = tree.match_prefix(params.MatchPrefixParams(key=full)).last_device_node
            tree.unlock(lock)
            tree.unlock(tree.lock(new_node))  # release_kv_cache unlocks what checkpoint locked
            fit()
            answers.append(tree.total_size())
        elif event[0] == "match":
            answers.append(tree.match_prefix(params.MatchPrefixParams(key=key(event[1]))).device_prefix_len)
        elif event[0] == "flush":
            tree.evict(params.EvictParams(num_tokens=tree.total_size()))
            answers.append(tree.total_size())
        else:
            raise ValueError(f"unknown event {event[0]!r}")
    return answers
