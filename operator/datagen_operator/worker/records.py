"""Pure builders: the /generate request for a (prompt, sample), and the record made from its answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Job:
    """One record to make: a rendered prompt and a sample index."""

    position: int
    id: str
    sample: int
    input_ids: list[int]
    has_tools: bool

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.sample)


def sampling_for_sample(sampling: dict[str, Any], sample: int) -> dict[str, Any]:
    """Sampling params for one sample. A fixed seed is offset by the sample index: samples of one prompt
    must differ (the same seed would make them identical) yet stay reproducible."""
    seed = sampling.get("sampling_seed")
    if seed is None or sample == 0:
        return sampling
    return {**sampling, "sampling_seed": seed + sample}


def generate_payload(job: Job, sampling: dict[str, Any], *, stream: bool) -> bytes:
    """The /generate body. `max_new_tokens` is always in `sampling` (the spec requires it; SGLang's
    default is 128). No `rid`: a retried request must not collide with an abandoned one still running."""
    body: dict[str, Any] = {"input_ids": job.input_ids, "sampling_params": sampling_for_sample(sampling, job.sample)}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server returned for one request, with how it was obtained."""

    output_ids: list[int]
    meta_info: dict[str, Any]
    server: str
    attempts: int
    latency_s: float


def build_record(job: Job, answer: Answer, flags: frozenset[str]) -> dict[str, Any]:
    """The stored record; field order is the documented one (id and sample first)."""
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
        "server": answer.server,
        "attempts": answer.attempts,
        "has_tools": job.has_tools,
        "flags": sorted(flags),
    }


def encode_record(record: dict[str, Any], output_ids_json: bytes | None = None) -> bytes:
    """The segment line. With the server's own encoding of output_ids at hand, the (large) array is
    copied as bytes instead of re-encoded; it then comes last in the line."""
    if output_ids_json is None:
        return orjson.dumps(record) + b"\n"
    head = orjson.dumps({key: value for key, value in record.items() if key != "output_ids"})
    return head[:-1] + b',"output_ids":' + output_ids_json + b"}\n"


def server_reject(job: Job, status: int, reason: str, server: str, attempts: int) -> dict[str, Any]:
    return {
        "key": f"record:{job.id}#{job.sample}",
        "kind": "server",
        "id": job.id,
        "sample": job.sample,
        "line": job.position,
        "status": status,
        "reason": reason,
        "server": server,
        "attempts": attempts,
    }


def malformed_reject(position: int, reason: str, excerpt: str, prompt_id: str | None) -> dict[str, Any]:
    return {"key": f"line:{position}", "kind": "malformed", "line": position, "id": prompt_id, "reason": reason,
            "excerpt": excerpt}  # fmt: skip
