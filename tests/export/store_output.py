"""Run outputs built with the store's own writer (segments, compaction, manifest), for export tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import MANIFEST_FORMAT, update_manifest
from datagen_operator.output.parquet import compact_shard
from datagen_operator.output.writer import ShardWriter

STOP = 163586  # Kimi-K2 <|im_end|>
VOCAB = 163840
FINGERPRINT = "f" * 64


def make_record(
    prompt_id: str,
    sample: int,
    input_ids: list[int],
    output_ids: list[int],
    *,
    finish: str = "stop",
    flags: list[str] | None = None,
) -> dict[str, Any]:
    finish_reason: dict[str, Any] = {"type": finish}
    if finish == "stop":
        finish_reason["matched"] = output_ids[-1]
    elif finish == "length":
        finish_reason["length"] = len(output_ids)
    return {
        "id": prompt_id,
        "sample": sample,
        "input_ids": input_ids,
        "output_ids": output_ids,
        "finish_reason": finish_reason,
        "prompt_tokens": len(input_ids),
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "latency_s": 0.5,
        "server": "http://sim",
        "attempts": 1,
        "has_tools": False,
        "flags": flags if flags is not None else (["truncated"] if finish == "length" else []),
        "line": 0,
        "prompt_hash": 0,
        "run": "run-uid",
    }


def random_records(prefix: str, count: int, *, seed: int, length_every: int = 5) -> list[dict[str, Any]]:
    """Stop-terminated records, every `length_every`-th ended on `length` (no stop token)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        prompt = rng.integers(0, VOCAB, int(rng.integers(3, 60))).tolist()
        body = rng.integers(0, STOP, int(rng.integers(1, 80))).tolist()  # ids below STOP: never a stop by chance
        if length_every and i % length_every == length_every - 1:
            out.append(make_record(f"{prefix}{i:04d}", i % 2, prompt, body, finish="length"))
        else:
            out.append(make_record(f"{prefix}{i:04d}", i % 2, prompt, [*body, STOP]))
    return out


def write_shard(layout: OutputLayout, shard: int, records: list[dict[str, Any]]) -> None:
    writer = ShardWriter(layout, shard)
    writer.recover()
    for record in records:
        writer.append(record)
    writer.close()


def build_output(
    root: Path,
    shards: dict[int, list[dict[str, Any]]],
    *,
    compacted: set[int],
    leftover_segments: set[int] = frozenset(),  # type: ignore[assignment]
) -> Path:
    """Write `shards` with the store; compact those in `compacted` (keeping their segments where listed in
    `leftover_segments`, as after a crash between compaction and segment removal)."""
    layout = OutputLayout(root)
    count = len(shards)
    states = {str(i): {"state": "complete" if i in compacted else "running"} for i in shards}
    update_manifest(
        layout,
        lambda _: {
            "format": MANIFEST_FORMAT,
            "fingerprint_sha256": FINGERPRINT,
            "shard_count": count,
            "shards": states,
        },
    )
    for shard, records in shards.items():
        write_shard(layout, shard, records)
        if shard in compacted:
            order = [(r["id"], r["sample"]) for r in records]
            compact_shard(layout, shard, count, order, remove_segments=shard not in leftover_segments)
    return root
