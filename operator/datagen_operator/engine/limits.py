"""SGLang's length accounting over its resolved server args (the keys `/server_info` reports): one rule for the
worker's and the preflight's too-long verdicts (`ContextLimit`, `too_long_reason`) and for the simulator, which
answers as SGLang would."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


# --- what the server refuses for length ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextLimit:
    """What SGLang refuses for length, read from /server_info.

    `context_length`: the tokenizer manager answers 400 "Requested token count exceeds the model's maximum
    context length" when `len(input_ids) + max_new_tokens` is above it. `/server_info` reports it only when
    the server was launched with --context-length; otherwise it is derived from `max_req_input_len`
    (= min(context, KV pool) - 1 - 5 in tp_worker.py): `max_req_input_len + 6` is the context when the KV
    pool is not the bound, and when it is, the scheduler would silently cap max_new_tokens below it (a cut
    answer), so the prompt is set aside either way.
    `max_input`: the scheduler refuses an input of `max_req_input_len` tokens or more.
    """

    context_length: int | None
    max_input: int | None
    reserved: int = 0
    """Tokens the server counts as input on top of the prompt (EAGLE's draft slots, `reserved_tokens`)."""
    kv_tokens: int | None = None
    """The smallest replica's KV pool (`max_total_num_tokens`): the scheduler caps a request's new tokens to what
    it holds beside the prompt (`memory_cap`), a cut answer, so such a prompt is set aside too."""
    page_size: int = 1


def context_limit(infos: Iterable[Mapping[str, Any]]) -> ContextLimit:
    """The tightest limit over the replicas' /server_info (`max_req_input_len` depends on each one's
    free GPU memory at start-up, so replicas can differ)."""
    contexts: list[int] = []
    inputs: list[int] = []
    pools: list[int] = []
    reserved, page = 0, 1
    for info in infos:
        reserved = max(reserved, reserved_tokens(info))
        page = max(page, _positive(info.get("page_size")) or 1)
        pool = _positive(info.get("max_total_num_tokens"))
        if pool:
            pools.append(pool)
        declared = _positive(info.get("context_length"))
        max_input = _positive(info.get("max_req_input_len"))
        if max_input:
            inputs.append(max_input)
        if declared:
            contexts.append(declared)
        elif max_input:
            contexts.append(max_input + 6)
    return ContextLimit(
        min(contexts, default=None), min(inputs, default=None), reserved, min(pools, default=None), page
    )


CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
"""Where SGLang 0.5.23 reads a model's context length, in order (`get_context_length`)."""


def model_context_limit(config: Mapping[str, Any], extra_args: Sequence[str]) -> ContextLimit:
    """The context SGLang will derive before it runs (`ModelConfig._derive_context_length`): `--context-length`
    when the server is given one (SGLang refuses a longer one unless told otherwise), else the model's config
    (its `text_config` for a multimodal model), scaled by `rope_scaling.factor` unless the scaling names its
    original length or is llama3's. What the KV pool allows is known only once the server runs."""
    declared = _context_length_arg(extra_args)
    if declared is not None:
        return ContextLimit(declared, None)
    nested = config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else config
    scaling = text.get("rope_scaling")
    rope: Mapping[str, Any] | None = scaling if isinstance(scaling, Mapping) else None
    factor = 1.0
    if rope and "original_max_position_embeddings" not in rope and rope.get("rope_type") != "llama3":
        factor = float(rope.get("factor", 1) or 1)
    for key in CONTEXT_LENGTH_KEYS:
        value = _positive(text.get(key))
        if value:
            return ContextLimit(int(factor * value), None)
    return ContextLimit(2048 if text else None, None)  # SGLang's default; no config at all: unknown


def _context_length_arg(extra_args: Sequence[str]) -> int | None:
    for index, arg in enumerate(extra_args):
        if arg == "--context-length" and index + 1 < len(extra_args):
            value = extra_args[index + 1]
        elif arg.startswith("--context-length="):
            value = arg.split("=", 1)[1]
        else:
            continue
        return (_positive(int(value)) or None) if value.isdigit() else None
    return None


def too_long_reason(prompt_tokens: int, max_new_tokens: int, limit: ContextLimit) -> str | None:
    """Why the server would refuse (or cut) this request for its length, or None when it fits."""
    if limit.max_input is not None and prompt_tokens >= limit.max_input:
        return (
            f"the prompt has {prompt_tokens} tokens; the server takes fewer than {limit.max_input} "
            "(max_req_input_len in /server_info)"
        )
    total = prompt_tokens + limit.reserved + max_new_tokens
    drafts = f" + {limit.reserved} speculative draft slots" if limit.reserved else ""
    asked = f"{prompt_tokens} prompt tokens{drafts} + max_new_tokens {max_new_tokens} = {total}"
    pool = limit.kv_tokens
    if limit.context_length is not None and total > limit.context_length:
        if pool is not None and pool <= limit.context_length:  # the context derived from the pool's bound
            return f"{asked} exceeds the server's KV pool of {pool} tokens (max_total_num_tokens in /server_info)"
        return f"{asked} exceeds the server's context length of {limit.context_length} tokens"
    if pool is not None:
        cap = memory_cap(prompt_tokens + limit.reserved, max_new_tokens, pool, limit.page_size)
        if cap < max_new_tokens:
            return (
                f"{asked}: the server's KV pool of {pool} tokens (max_total_num_tokens in /server_info, page size "
                f"{limit.page_size}) holds only {cap} new tokens beside this prompt; SGLang would cut the answer there"
            )
    return None
