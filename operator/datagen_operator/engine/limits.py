"""SGLang's length accounting over its resolved server args (the keys `/server_info` reports): one rule for the
worker's and the preflight's too-long verdicts and for the simulator, which answers as SGLang would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3"})
"""`SpeculativeAlgorithm.is_eagle()` among the algorithms a resolved launch reports (NEXTN resolves to EAGLE)."""


def reserved_tokens(server_args: Mapping[str, Any]) -> int:
    """Output slots reserved per request on top of its input (`managers/utils.compute_num_reserved_tokens`):
    EAGLE and EAGLE3 keep their draft tokens there, so the tokenizer manager's length checks count them as
    input; other algorithms reserve none."""
    if server_args.get("speculative_algorithm") not in EAGLE_ALGORITHMS:
        return 0
    topk = int(server_args.get("speculative_eagle_topk") or 0)
    steps = int(server_args.get("speculative_num_steps") or 0)
    return max(topk * steps, int(server_args.get("speculative_num_draft_tokens") or 0))


def memory_cap(input_tokens: int, max_new_tokens: int, token_capacity: int, page_size: int = 1) -> int:
    """The new tokens SGLang's scheduler lets a request have beside its prompt in an empty KV pool
    (`BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`, called from `Scheduler.init_req_max_new_tokens`): the
    pool's `max_total_num_tokens` less the prompt rounded up to pages, one page and one token. An answer capped
    here ends `length` short of max_new_tokens (tests/contract/test_memory_cap.py runs SGLang's own)."""
    paged_input = -(-input_tokens // page_size) * page_size
    return max(0, min(max_new_tokens, token_capacity - paged_input - page_size - 1))
