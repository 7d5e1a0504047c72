"""Benchmark: `datagen export` throughput and peak memory on a synthetic run output.

    .venv/bin/python bench/export.py [--tokens 200e6] [--shards 4] [--formats speculators,trl] [--keep DIR] [--quick]

Writes a synthetic output of about `--tokens` stored tokens (prompt ~U(200, 2000), output ~U(200, 6000)
tokens, uniform ids, the stop token last) with the store's own code: each record is `build_record`'s (so
it has every column the store has), the row groups are `ColumnBatch`'s with compaction's bounds, written
with `parquet_schema` and `PARQUET_WRITE_OPTIONS` under `OutputLayout`'s names. Then it times each format's
export in a fresh subprocess (`datagen export`'s function, as the CLI calls it) and reads its peak RSS
from the kernel. Prints one line per format and, last:

    export_tokens_per_s=<slowest format> (goal >= 20M) export_rss_mb=<largest peak RSS> (goal <= 300)

`--quick`: 3M tokens in 2 shards, seconds (tests/test_bench_quick.py runs it): the figures are printed,
not comparable with the goals.

Goals: >= 20M tokens/s and <= 300 MB whatever the output size. The text format is tokenizer-bound
(decode + encode per row) and not part of the goal.
"""

from __future__ import annotations

import sys

# `python bench/export.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import shutil
import subprocess
import tempfile
import time
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import MANIFEST_FORMAT, update_manifest
from datagen_operator.output.parquet import (
    PARQUET_WRITE_OPTIONS,
    ROW_GROUP_ROWS,
    ROW_GROUP_TOKENS,
    ColumnBatch,
    parquet_schema,
)
from datagen_operator.output.records import Answer, build_record
from datagen_operator.prompts.job import Job

STOP = 163586
RUN_UID = "5f1c2b9e-7a41-4d2e-9c3b-1e8f0a6d4c27"


def synthetic_records(rng: np.random.Generator, start: int, rows: int) -> Iterator[dict[str, Any]]:
    """`rows` records as the worker stores them: `build_record` of a Job and an Answer (every column the
    store has, whatever it gains later), with prompt ~U(200, 2000) and output ~U(200, 6000) uniform ids, the
    stop token last. Ids are array('i') so the store's ColumnBatch copies them in C."""
    prompt_lengths = rng.integers(200, 2000, rows)
    output_lengths = rng.integers(200, 6000, rows)
    prompts = rng.integers(0, STOP, int(prompt_lengths.sum()), dtype=np.int32)
    outputs = rng.integers(0, STOP, int(output_lengths.sum()), dtype=np.int32)
    prompt_at = output_at = 0
    for row in range(rows):
        prompt_end, output_end = prompt_at + int(prompt_lengths[row]), output_at + int(output_lengths[row])
        input_ids = array("i", prompts[prompt_at:prompt_end].tobytes())
        output_ids = array("i", outputs[output_at:output_end].tobytes())
        output_ids[-1] = STOP
        prompt_at, output_at = prompt_end, output_end
        position = start + row
        meta = {"finish_reason": {"type": "stop", "matched": STOP}, "prompt_tokens": len(input_ids),
                "completion_tokens": len(output_ids), "cached_tokens": 0}  # fmt: skip
        job = Job(position, f"p{position:08d}", 0, input_ids, False, 2**63 + position)
        answer = Answer(output_ids, meta, "http://10.0.0.1:30000", 1, 12.5)
        yield build_record(job, answer, frozenset(), RUN_UID)


def write_synthetic_output(root: Path, total_tokens: int, shards: int) -> int:
    """A compacted output of about `total_tokens` stored tokens: the store's ColumnBatch, schema, write options
    and row-group bounds (as compaction writes them), file names from OutputLayout, a complete manifest."""
    layout = OutputLayout(root)
    layout.data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_shard = total_tokens // shards
    written = start = 0
    states = {}
    for shard in range(shards):
        with pq.ParquetWriter(layout.parquet(shard, shards), parquet_schema(), **PARQUET_WRITE_OPTIONS) as writer:
            batch, shard_tokens = ColumnBatch(), 0
            while shard_tokens < per_shard:
                rows = max(1, min(1024, (per_shard - shard_tokens) // 4200))  # mean row: 1100 + 3100 tokens
                for record in synthetic_records(rng, start, rows):
                    batch.add(record)
                    shard_tokens += len(record["input_ids"]) + len(record["output_ids"])
                    if batch.tokens >= ROW_GROUP_TOKENS or batch.rows >= ROW_GROUP_ROWS:
                        writer.write_table(batch.table())
                        batch = ColumnBatch()
                start += rows
            if batch.rows:
                writer.write_table(batch.table())
        written += shard_tokens
        states[str(shard)] = {"state": "complete"}
    update_manifest(
        layout,
        lambda _: {"format": MANIFEST_FORMAT, "fingerprint_sha256": "0" * 64, "shard_count": shards, "shards": states},
    )
    return written


CHILD = """
import os, sys, time
from datagen_operator.export.exporter import export_output
from datagen_operator.export.options import ExportOptions
started, cpu = time.perf_counter(), os.times()
manifest = export_output(sys.argv[1], sys.argv[2], ExportOptions(sys.argv[3]))
seconds, cpu_end = time.perf_counter() - started, os.times()
cpu_s = cpu_end.user + cpu_end.system - cpu.user - cpu.system
out_bytes = sum(p["bytes"] for p in manifest["parts"])
# VmHWM, not ru_maxrss: ru_maxrss carries the forking parent's peak across exec.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(manifest["counts"]["tokens_written"], seconds, cpu_s, out_bytes, peak_kb)
"""


def run_export(source: Path, out: Path, export_format: str) -> tuple[int, float, float, int, float]:
    """Tokens, seconds, CPU seconds, bytes written and peak RSS (MB, the child's own, imports included)."""
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(source), str(out), export_format], check=True, capture_output=True, text=True
    )
    tokens, seconds, cpu_s, out_bytes, peak_kb = result.stdout.split()
    return int(tokens), float(seconds), float(cpu_s), int(out_bytes), int(peak_kb) / 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--formats", default="trl,speculators")
    parser.add_argument("--keep", help="reuse / keep the synthetic output here")
    parser.add_argument("--quick", action="store_true", help="3M tokens, 2 shards: seconds; figures not judged")
    parser.add_argument(
        "--workdir",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="where the export is written (default: tmpfs, so the number is the exporter's, not the disk's)",
    )
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.shards = 3e6, 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.workdir))
    source = Path(args.keep) if args.keep else workdir / "out"
    try:
        if not (source / "manifest.json").exists():
            started = time.perf_counter()
            tokens = write_synthetic_output(source, int(args.tokens), args.shards)
            size = sum(p.stat().st_size for p in OutputLayout(source).data_dir.glob("*.parquet"))
            print(
                f"synthetic output: {tokens / 1e6:.0f}M tokens, {size / 1e6:.0f} MB Parquet ({time.perf_counter() - started:.0f} s)"
            )
        rates, peaks = [], []
        for export_format in args.formats.split(","):
            out = workdir / f"export-{export_format}"
            tokens, seconds, cpu_s, out_bytes, peak_mb = run_export(source, out, export_format)
            shutil.rmtree(out)
            rates.append(tokens / seconds)
            peaks.append(peak_mb)
            print(
                f"{export_format}: {tokens / 1e6:.0f}M tokens in {seconds:.1f} s = {tokens / seconds / 1e6:.1f}M tokens/s, "
                f"{tokens / cpu_s / 1e6:.1f}M tokens per CPU-second, {out_bytes / 1e6:.0f} MB written, peak RSS {peak_mb:.0f} MB"
            )
        if args.quick:
            print("quick run (--quick): small sizes, the figures below are not comparable with the goals")
        print(f"export_tokens_per_s={min(rates):.0f} (goal >= 20M) export_rss_mb={max(peaks):.0f} (goal <= 300)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
