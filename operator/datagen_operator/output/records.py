"""Pure builders: the record made from the answer to a (prompt, sample, turn), and the rejects (the request it
answers is engine/requests.py's `generate_body`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# Causes of a prompt set aside by the worker after the dataset was read (dataset-level causes are in
# prompts.line_shape.CAUSES), defined with the counter that counts them.
from datagen_operator.api.progress import TOO_LONG as TOO_LONG
from datagen_operator.api.progress import UNRENDERABLE as UNRENDERABLE
from datagen_operator.engine.limits import memory_cap, reserved_tokens
from datagen_operator.output.layout import Key
from datagen_operator.prompts.conversation import AnswerSplit, Turns
from datagen_operator.prompts.lines import line_key, line_number


@dataclass(slots=True)
class Conversation:
    """A conversation being regenerated (generation.turns all): its turns, tools and the model's answers so far.
    One lane holds it from its first turn to be sent to its last, so its turns go out in order."""

    turns: Turns
    tools: list[dict[str, Any]] | None
    answers: list[AnswerSplit]
    variables: dict[str, Any] | None = None
    """The line's own chat_template_kwargs, rendered into every turn."""


@dataclass(frozen=True, slots=True)
class Job:
    """One record to make: a rendered prompt, a sample index and, for a conversation, its turn."""

    position: int
    id: str
    sample: int
    input_ids: list[int]
    has_tools: bool
    prompt_hash: int
    """prompts.pin.prompt_hash of the dataset line the prompt was read from: verify checks it against the pin."""
    turn: int = 0
    conversation: Conversation | None = None
    thinking: bool | None = None
    """The line's own thinking switch (its chat_template_kwargs), when it sets one: its record is judged by it."""
    source_fields: str | None = None
    """The line's other fields, JSON text (prompts.lines.source_fields): every turn's record carries them."""

    @property
    def key(self) -> Key:
        return (self.id, self.sample, self.turn)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server returned for one request, with how it was obtained."""

    output_ids: Sequence[int]
    """A list, or the server's bytes behind a Sequence (engine.wire.WireIds)."""
    meta_info: dict[str, Any]
    server: str
    attempts: int
    latency_s: float
    done_at: float | None = None
    """When the answer arrived (Unix seconds): the report's throughput over time (compaction keeps dataset order)."""


def build_record(
    job: Job, answer: Answer, flags: frozenset[str], run: str | None, split: AnswerSplit | None = None
) -> dict[str, Any]:
    """The stored record; field order is the documented one (id and sample first). `run` is the holder of the
    output's lease that generated it (output/lease.py): the run's UID, or `local:<host>:<pid>`. `split`: a
    conversation's answer as its next turn's history holds it (prompts/conversation.py)."""
    meta = answer.meta_info
    return {
        "id": job.id,
        "sample": job.sample,
        "input_ids": job.input_ids,
        "output_ids": answer.output_ids,
        "finish_reason": meta.get("finish_reason"),
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "latency_s": round(answer.latency_s, 4),
        "done_at": None if answer.done_at is None else round(answer.done_at, 3),
        "server": answer.server,
        "attempts": answer.attempts,
        "has_tools": job.has_tools,
        "flags": sorted(flags),
        "line": line_number(job.position),
        "prompt_hash": job.prompt_hash,
        "run": run,
        "turn": job.turn,
        "thinking": job.thinking,
        "answer_content": split.content if split is not None else None,
        "answer_reasoning": split.reasoning_content if split is not None else None,
        "answer_tool_calls": [call.as_record() for call in split.tool_calls] if split is not None else None,
        "num_retractions": meta.get("num_retractions"),
        "source_fields": job.source_fields,
    }


def encode_record(record: dict[str, Any], output_ids_json: bytes | None = None) -> bytes:
    """The segment line. With the server's own encoding of output_ids at hand, the (large) array is
    copied as bytes instead of re-encoded; it then comes last in the line."""
    if output_ids_json is None:
        return orjson.dumps(record) + b"\n"
    head = orjson.dumps({key: value for key, value in record.items() if key != "output_ids"})
    return head[:-1] + b',"output_ids":' + output_ids_json + b"}\n"


def server_reject(job: Job, status: int, reason: str, server: str, attempts: int) -> dict[str, Any]:
    turn = f"@{job.turn}" if job.conversation is not None else ""
    return {
        "key": f"record:{job.id}#{job.sample}{turn}",
        "kind": "server",
        "id": job.id,
        "sample": job.sample,
        "turn": job.turn,
        "line": line_number(job.position),
        "status": status,
        "reason": reason,
        "server": server,
        "attempts": attempts,
    }


def malformed_reject(position: int, reason: str, excerpt: str, prompt_id: str | None, cause: str) -> dict[str, Any]:
    """A dataset line set aside (bad JSON, id, messages, tools) or a prompt the template cannot render."""
    return {"key": line_key(position), "kind": "malformed", "cause": cause, "line": line_number(position), "id": prompt_id,
            "reason": reason, "excerpt": excerpt}  # fmt: skip


def too_long_reject(position: int, prompt_id: str, reason: str) -> dict[str, Any]:
    return {"key": line_key(position), "kind": TOO_LONG, "cause": TOO_LONG, "line": line_number(position), "id": prompt_id,
            "reason": reason}  # fmt: skip


TURNS_KIND = "turns"


def turns_reject(job: Job, cause: str, reason: str) -> dict[str, Any]:
    """The turns of a conversation's sample from `job.turn` on, never sent (prompts.conversation.TURN_CAUSES)."""
    planned = len(job.conversation.turns) if job.conversation is not None else job.turn + 1
    return turns_entry(job.position, job.id, job.sample, job.turn, planned, cause, reason)


def turns_entry(
    position: int, prompt_id: str, sample: int, turn: int, planned: int, cause: str, reason: str
) -> dict[str, Any]:
    return {"key": f"turns:{prompt_id}#{sample}@{turn}", "kind": TURNS_KIND, "cause": cause, "id": prompt_id,
            "sample": sample, "turn": turn, "turns": planned, "line": line_number(position),
            "reason": reason}  # fmt: skip


def reject_cause(entry: Mapping[str, Any]) -> str:
    """The cause of a dataset line's rejects.jsonl entry (`malformed_reject`, `too_long_reject`)."""
    return str(entry.get("cause") or "unknown")


# --- the server's context -------------------------------------------------------------------------


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
    """Tokens the server counts as input on top of the prompt (EAGLE's draft slots, engine/limits.py)."""
    kv_tokens: int | None = None
    """The smallest replica's KV pool (`max_total_num_tokens`): the scheduler caps a request's new tokens to what
    it holds beside the prompt (engine.limits.memory_cap), a cut answer, so such a prompt is set aside too."""
    page_size: int = 1


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_limit(infos: Iterable[Mapping[str, Any]]) -> ContextLimit:
    """The tightest limit over the replicas' /server_info (`max_req_input_len` depends on each one's
    free GPU memory at start-up, so replicas can differ)."""
    contexts: list[int] = []
    inputs: list[int] = []
    pools: list[int] = []
    reserved, page = 0, 1
    for info in infos:
        reserved = max(reserved, reserved_tokens(info))
        page = max(page, _positive_int(info.get("page_size")) or 1)
        pool = _positive_int(info.get("max_total_num_tokens"))
        if pool is not None:
            pools.append(pool)
        declared = _positive_int(info.get("context_length"))
        max_input = _positive_int(info.get("max_req_input_len"))
        if max_input is not None:
            inputs.append(max_input)
        if declared is not None:
            contexts.append(declared)
        elif max_input is not None:
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
        value = _positive_int(text.get(key))
        if value is not None:
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
        return _positive_int(int(value)) if value.isdigit() else None
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
