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
