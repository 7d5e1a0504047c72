"""Record flags and SGLang's finish types: the names a record is flagged with (counted by the workers, read by the
rolling checks, left out by an export) and the rule that a `length` finish is truncated. In `api/` so the spec
(spec.export.excludeFlags) and the CRD refuse a name that is none of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

# Flag names: stable strings, counted by workers and read by the rolling checks.
TOKEN_COUNT_MISMATCH = "token_count_mismatch"
PROMPT_SUFFIX_LEAK = "prompt_suffix_leak"
NO_THINK_START = "no_think_start"
NO_THINK_END = "no_think_end"
EMPTY_REASONING = "empty_reasoning"
UNEXPECTED_REASONING = "unexpected_reasoning"
TRUNCATED = "truncated"
"""The answer ended on `length` (`ends_truncated`): it has no stop token at the end."""
BAD_TERMINATION = "bad_termination"
UNBALANCED_TOOL_CALLS = "unbalanced_tool_calls"
ABORTED = "aborted"
NAN_REPLACED = "nan_replaced"
"""A `stop` whose `finish_reason.matched` is not a token id: SGLang sampled an id outside the vocabulary (NaN or
inf logits), wrote a stop id in its place and reported `matched: "NaN happened"` (`Req._check_vocab_boundary_finish`).
The last id is a stop id, so only `matched` tells; the record's tail is not what the model sampled."""
RETRACTED = "retracted"
"""SGLang retracted the request (meta_info.num_retractions > 0) while the sampling held state over the output
(penalties, min_new_tokens): that state started again from zero, so the record was not sampled as asked."""
TRUNCATED_BY_MEMORY = "truncated_by_memory"
"""Beside `truncated`: the answer ended `length` with fewer tokens than the request's max_new_tokens. SGLang's
scheduler caps a request's new tokens to what its KV pool holds beside the prompt (`max_new_tokens_for_memory`,
in pages); the worker sends no prompt too long for the context, so the pool is the cap."""
PROMPT_CLOSES_THINK = "prompt_closes_think"
"""A thinking run whose rendered prompt ends with an empty think block: the template was rendered with
thinking off (the seeds' case), so the model is told not to reason."""

ALL_FLAGS: tuple[str, ...] = (
    TOKEN_COUNT_MISMATCH,
    PROMPT_SUFFIX_LEAK,
    NO_THINK_START,
    NO_THINK_END,
    EMPTY_REASONING,
    UNEXPECTED_REASONING,
    TRUNCATED,
    BAD_TERMINATION,
    UNBALANCED_TOOL_CALLS,
    ABORTED,
    NAN_REPLACED,
    PROMPT_CLOSES_THINK,
    RETRACTED,
    TRUNCATED_BY_MEMORY,
)


def unknown_flags_problem(names: Iterable[str]) -> str | None:
    """Why these names are not all record flags (each unknown one named, and the known ones), or None: the
    spec's excludeFlags and `datagen export --exclude-flags` say it in these words."""
    unknown = sorted(set(names) - set(ALL_FLAGS))
    return f"unknown {', '.join(unknown)}; known: {', '.join(ALL_FLAGS)}" if unknown else None


# --- SGLang's finish_reason -----------------------------------------------------------------------------------


def finish_type(finish_reason: Any) -> str | None:
    """'stop', 'length', 'abort' from SGLang's finish_reason dict (or a JSON-decoded copy)."""
    if isinstance(finish_reason, dict):
        value = finish_reason.get("type")
        return value if isinstance(value, str) else None
    if isinstance(finish_reason, str):
        return finish_reason
    return None


def stored_finish_type(finish_reason_json: str | None) -> str | None:
    """`finish_type` of a stored record's finish_reason column (SGLang's dict as JSON text)."""
    return finish_type(orjson.loads(finish_reason_json)) if finish_reason_json else None


def ends_truncated(finish: str | None) -> bool:
    """A `length` finish: the answer was cut at its token limit, with no stop token (flagged TRUNCATED)."""
    return finish == "length"


def effective_flags(flags: Sequence[str], finish: str | None) -> frozenset[str]:
    """The stored flags, plus `truncated` whenever the row ended on `length` (a record stored before the flag was
    counted holds the finish alone)."""
    return frozenset(flags) | ({TRUNCATED} if ends_truncated(finish) else frozenset())
