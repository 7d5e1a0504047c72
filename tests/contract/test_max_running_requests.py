"""engine.limits.max_running_requests_per_rank is SGLang 0.5.23's own limit of a DP rank's running batch
(`KVCacheConfigurator.resolve_max_num_reqs`): the simulator bounds its running batch with it and reports it as
`/server_info`'s `internal_states[i].effective_max_running_requests_per_dp`, which the canary reads."""

from __future__ import annotations

import pytest

from datagen_operator.engine.limits import max_running_requests_per_rank
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

CASES = [
    (1_000_000, 32_768, None, 1),  # not asked: 512 per context, clamped to 4096
    (163_840, 32_768, None, 1),  # 5 contexts: 2560
    (16_384, 32_768, None, 1),  # under one context: at least 2048 ...
    (2_000, 32_768, None, 1),  # ... but never more than half the pool
    (1_000_000, 32_768, 64, 1),  # asked
    (1_000_000, 32_768, 256, 4),  # asked, split over attention-DP ranks
    (1_000_000, 32_768, 2, 4),  # at least one each
    (100, 32_768, 64, 1),  # asked, capped at half the pool
]


@pytest.mark.parametrize(("capacity", "context_len", "requested", "attn_dp_size"), CASES)
def test_the_running_limit_is_sglangs(
    sglang: SGLang, capacity: int, context_len: int, requested: int | None, attn_dp_size: int
) -> None:
    theirs = sglang.call(sglang_side.resolve_max_num_reqs, capacity, context_len, requested, attn_dp_size)
    assert max_running_requests_per_rank(capacity, context_len, requested, attn_dp_size) == theirs
