"""SGLang's length accounting over its resolved server args (the keys `/server_info` reports): one rule for the
worker's and the preflight's too-long verdicts and for the simulator, which answers as SGLang would."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


def max_running_requests_per_rank(
    token_capacity: int, context_len: int, requested: int | None = None, attn_dp_size: int = 1
) -> int:
    """The running requests one DP rank's scheduler admits (`KVCacheConfigurator.resolve_max_num_reqs`,
    `/server_info`'s `internal_states[i].effective_max_running_requests_per_dp`): `--max-running-requests` split
    over the attention-DP ranks, else 512 per context the pool holds, clamped to 2048..4096; never more than half
    the token pool."""
    if requested is not None:
        return max(1, min(max(1, requested // attn_dp_size), token_capacity // 2))
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    return max(1, min(estimated, token_capacity // 2))


@dataclass(frozen=True)
class BatchLimits:
    """What one server runs at once, as its `/server_info` reports: the sum over its DP ranks."""

    max_running_requests: int
    token_pool: int
    """Tokens of KV cache over its DP ranks (`memory_usage.token_capacity`, else `max_total_num_tokens`)."""


def batch_limits(info: Mapping[str, Any]) -> BatchLimits | None:
    """One server's batch limits from its `/server_info` (SGLang 0.5.23: each rank's
    `effective_max_running_requests_per_dp` in `internal_states`); None when it does not say (an older server)."""
    states = [s for s in info.get("internal_states") or () if isinstance(s, Mapping)]
    running = [_positive(s.get("effective_max_running_requests_per_dp")) for s in states]
    if not states or 0 in running:
        return None
    pools = [_positive((s.get("memory_usage") or {}).get("token_capacity")) for s in states]
    pool = sum(pools) if 0 not in pools else _positive(info.get("max_total_num_tokens")) * len(states)
    return BatchLimits(sum(running), pool)


def _positive(value: Any) -> int:
    """An int count as reported, or 0 where it is missing or not one (a bool is not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
