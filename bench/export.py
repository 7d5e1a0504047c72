"""Benchmark: `datagen export` throughput and peak memory on a synthetic run output.

    .venv/bin/python bench/export.py [--tokens 200e6] [--shards 4] [--formats speculators,trl] [--keep DIR]

Writes a synthetic output of about `--tokens` stored tokens (prompt ~U(200, 2000), output ~U(200, 6000)
tokens, uniform ids, the stop token last) in the store's own Parquet format (`parquet_schema`,
`PARQUET_WRITE_OPTIONS`, row groups of `ROW_GROUP_TOKENS`, file names from `OutputLayout`), then times
each format's export in a fresh subprocess (`datagen export`'s function, as the CLI calls it) and reads
its peak RSS from the kernel. Prints one line per format and, last:

    export_tokens_per_s=<slowest format> export_rss_mb=<largest peak RSS>

Goals: >= 20M tokens/s and <= 300 MB whatever the output size. The text format is tokenizer-bound
(decode + encode per row) and not part of the goal.
"""

from __future__ import annotations

import sys

# `python bench/export.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import MANIFEST_FORMAT, update_manifest
from datagen_operator.output.parquet import PARQUET_WRITE_OPTIONS, ROW_GROUP_TOKENS, parquet_schema

STOP = 163586
VOCAB = 163840


def synthetic_row_group(rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    prompt_lengths = rng.integers(200, 2000, rows)
    output_lengths = rng.integers(200, 6000, rows)

    def tokens(lengths: np.ndarray, stop_last: bool) -> pa.ListArray:
        values = rng.integers(0, STOP, int(lengths.sum()), dtype=np.int32)
        offsets = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        if stop_last:
            values[offsets[1:] - 1] = STOP
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    ids = [f"p{start + i:08d}" for i in range(rows)]
    columns = {
        "id": pa.array(ids),
        "sample": pa.array(np.zeros(rows, np.int32)),
        "input_ids": tokens(prompt_lengths, False),
        "output_ids": tokens(output_lengths, True),
        "finish_reason": pa.array([json.dumps({"type": "stop", "matched": STOP})] * rows),
        "prompt_tokens": pa.array(prompt_lengths.astype(np.int32)),
        "completion_tokens": pa.array(output_lengths.astype(np.int32)),
        "cached_tokens": pa.array(np.zeros(rows, np.int32)),
        "latency_s": pa.array(np.full(rows, 12.5)),
        "server": pa.array(["http://10.0.0.1:30000"] * rows),
        "attempts": pa.array(np.ones(rows, np.int32)),
        "has_tools": pa.array(np.zeros(rows, np.bool_)),
        "flags": pa.array([[] for _ in range(rows)], type=pa.list_(pa.string())),
    }
    schema = parquet_schema()
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def write_synthetic_output(root: Path, total_tokens: int, shards: int) -> int:
    layout = OutputLayout(root)
    layout.data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_shard = total_tokens // shards
    rows_per_group = max(1, min(ROW_GROUP_TOKENS, per_shard) // 4200)  # mean row: 1100 + 3100 tokens
    written, start = 0, 0
    states = {}
    for shard in range(shards):
        with pq.ParquetWriter(layout.parquet(shard, shards), parquet_schema(), **PARQUET_WRITE_OPTIONS) as writer:
            shard_tokens = 0
            while shard_tokens < per_shard:
                table = synthetic_row_group(rng, start, rows_per_group)
                writer.write_table(table)
                start += table.num_rows
                shard_tokens += len(table["input_ids"].combine_chunks().values)
                shard_tokens += len(table["output_ids"].combine_chunks().values)
        written += shard_tokens
        states[str(shard)] = {"state": "complete"}
    update_manifest(
        layout,
        lambda _: {"format": MANIFEST_FORMAT, "fingerprint_sha256": "0" * 64, "shard_count": shards, "shards": states},
    )
    return written


CHILD = """
import os, sys, time
from datagen_operator.export.run import ExportOptions, export_output
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
    parser.add_argument(
        "--workdir",
        default="/dev/shm" if Path("/dev/shm").is_dir() else None,
        help="where the export is written (default: tmpfs, so the number is the exporter's, not the disk's)",
    )
    args = parser.parse_args()
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
        print(f"export_tokens_per_s={min(rates):.0f} export_rss_mb={max(peaks):.0f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
