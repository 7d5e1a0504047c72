"""Pure builders: the record made from the answer to a (prompt, sample, turn), and the rejects (the request it
answers is engine/requests.py's `generate_body`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# Causes of a prompt set aside by the worker after the dataset was read (dataset-level causes are in
# prompts.line_shape.CAUSES), defined with the counter that counts them.
from datagen_operator.api.progress import TOO_LONG as TOO_LONG
from datagen_operator.api.progress import UNRENDERABLE as UNRENDERABLE
from datagen_operator.prompts.conversation import AnswerSplit
from datagen_operator.prompts.job import Job
from datagen_operator.prompts.lines import line_key, line_number


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


def stored_split(record: Mapping[str, Any]) -> AnswerSplit:
    """A record's answer split as stored (its tool calls none where written before the column)."""
    from datagen_operator.engine.tool_calls import ParsedCall

    calls = tuple(ParsedCall(call["name"], call["arguments"]) for call in record.get("answer_tool_calls") or ())
    return AnswerSplit(record["answer_content"] or "", record.get("answer_reasoning"), calls)
