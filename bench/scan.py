"""Benchmark: one ShardScan pass over 1M short JSONL prompts, against orjson parsing the same lines.

    .venv/bin/python bench/scan.py [--prompts 1000000] [--repeat 3] [--quick]

The dataset is bench/scale.py's (short chat prompts, 1,000 distinct questions, each id its own line).
Measured in this one run as CPU seconds of this process (`time.process_time`: the machine is shared, and
wall time there measures the neighbours; alone, the two are the same), best of `--repeat` each, the two
alternating:
- scan_s: iterating `ShardScan(DatasetRef(path), 0, 1)` to the end (what the worker's shard plan, `datagen verify`
  and the dataset summary pay), every line validated, checked for duplicates and turned into a PromptRef;
- orjson_s: reading the same file and `orjson.loads` of every line, nothing else (the floor).
Also printed: the scan as shard 0 of 4 (ids hashed to their shard). Last line, scaled to 1M lines:

    scan_s_1m=<s> orjson_s_1m=<s> ratio=<scan_s / orjson_s>
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import os
import tempfile
import time
from pathlib import Path

import orjson

from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.lines import MalformedLine
from datagen_operator.prompts.scan import ShardScan

QUESTIONS = 1000


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def write_dataset(path: Path, prompts: int) -> None:
    with path.open("wb") as file:
        for start in range(0, prompts, 10_000):
            lines = []
            for i in range(start, min(start + 10_000, prompts)):
                k = i % QUESTIONS
                question = f"Q{k}: in one line, why does a {k % 17}-stage pipeline need checksums?"
                lines.append(orjson.dumps({"id": f"p{i:07d}", "messages": [{"role": "user", "content": question}]}))
            file.write(b"\n".join(lines) + b"\n")


def time_orjson(path: Path) -> float:
    start = time.process_time()
    loads = orjson.loads
    with path.open("rb") as file:
        for line in file:
            loads(line)
    return time.process_time() - start


def time_scan(path: Path, shard_index: int, shard_count: int) -> tuple[float, int]:
    start = time.process_time()
    kept = 0
    for item in ShardScan(DatasetRef(path), shard_index, shard_count):
        kept += not isinstance(item, MalformedLine)
    return time.process_time() - start, kept


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.repeat = 20_000, 1
    print(load(), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-scan-") as tmp:
        path = Path(tmp) / "prompts.jsonl"
        write_dataset(path, args.prompts)
        scans: list[float] = []
        parses: list[float] = []
        for _ in range(args.repeat):
            parses.append(time_orjson(path))
            seconds, kept = time_scan(path, 0, 1)
            assert kept == args.prompts, kept
            scans.append(seconds)
        sharded, kept = time_scan(path, 0, 4)
        print(f"scan as shard 0 of 4: {sharded:.2f} CPU s, {kept} prompts kept", flush=True)
    scale = 1_000_000 / args.prompts
    scan_s, orjson_s = min(scans) * scale, min(parses) * scale
    print(f"scan runs {[round(s, 2) for s in scans]} CPU s, orjson runs {[round(s, 2) for s in parses]} CPU s")
    print(load())
    print(f"scan_s_1m={scan_s:.2f} orjson_s_1m={orjson_s:.2f} ratio={scan_s / orjson_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
