"""Benchmark: does the server ever wait on the client? Shards with skewed answer lengths, with and without work
stealing between them.

    .venv/bin/python bench/idle.py [--shards 8] [--prompts 10000] [--concurrency 16] [--tokens-per-s 400]
                                   [--turns 1] [--quick]

Writes `--prompts` prompts whose ids put the long ones in the first `--slow-shards` shards (`--long-words` words
against `--short-words`), and starts the SGLang simulator at GPU pace with answers as long as their prompts
(`--sim-answer-tokens-per-prompt-token`), so those shards have several times the others' work. Then, once with
stealing (the default) and once with `--no-steal`, `--shards` `datagen worker` processes at once (one per
shard, `clients.concurrency` each, a fresh simulator and output each time). The simulator counts the time with
fewer /generate requests in flight than shards x concurrency (`--sim-expected-in-flight`, engine/sim/occupancy.py),
from bulk start (that many first in flight: every worker sending):

- idle while prompts were unsent: the requests missing from shards x concurrency, times their seconds, over
  shards x concurrency x the seconds to the last request received: the server's capacity left unused while a
  client could have filled it. The goal, <= 2 %.
- the same to the last answer (with the run's final drain, which no client can fill), and the strict share of
  wall time with any slot empty (at these request times of a fraction of a second dominated by each lane's
  millisecond between an answer and its next request): printed beside it.

`--turns N`: each line a conversation of N user turns, regenerated whole (generation.turns all): a turn is sent
only once the answer before it is recorded, so this shows whether turns waiting on each other leave the server
idle.

One line per side, then the last line:

    idle_steal=<fraction> (goal <= 0.02) idle_no_steal=<fraction> (goal <= 0.02) ...
"""

from __future__ import annotations

import sys

# `python bench/idle.py` puts bench/ first on sys.path, where a sibling benchmark's module name
# (bench/operator.py) would shadow the standard library's `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GOAL = 0.02


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def write_dataset(path: Path, args: argparse.Namespace) -> tuple[int, int]:
    """(long prompts, short prompts): ids owned by the first `slow_shards` shards get long questions."""
    from datagen_operator.prompts.shards import shard_of_id

    long_count = 0
    with path.open("wb") as file:
        for i in range(args.prompts):
            prompt_id = f"q{i:06d}"
            slow = shard_of_id(prompt_id, args.shards) < args.slow_shards
            long_count += slow
            words = " ".join(f"w{(i + k) % 97}" for k in range(args.long_words if slow else args.short_words))
            messages: list[dict[str, str]] = []
            for turn in range(args.turns):
                messages.append({"role": "user", "content": f"Question {i}.{turn}: {words}?"})
                if args.turns > 1:
                    messages.append({"role": "assistant", "content": "(the dataset's answer, never sent)"})
            line = {"id": prompt_id, "messages": messages}
            file.write(orjson.dumps(line) + b"\n")
    return long_count, args.prompts - long_count


def start_sim(workdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "sim.port"
    port_file.unlink(missing_ok=True)
    cmd = [
        PYTHON, "-m", "datagen_operator.cli", "sim-server", "--port", "0", "--sim-port-file", str(port_file),
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-metrics",
        "--sim-speed", "gpu", "--sim-tokens-per-s", str(args.tokens_per_s), "--sim-ttft-s", "0.05",
        "--sim-batch-capacity", str(4 * args.shards * args.concurrency),
        "--sim-answer-tokens-per-prompt-token", str(args.answer_per_prompt_token), "--sim-length-sigma", "0.3",
        "--sim-mean-reasoning-tokens", "8", "--sim-expected-in-flight", str(args.shards * args.concurrency),
        "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"simulator did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{int(port_file.read_text().strip())}"


def spec(dataset: Path, tokenizer_dir: Path, output: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": {"preset": "kimi-k2.5", "path": str(tokenizer_dir)},
        "dataset": {"path": str(dataset)},
        "generation": {
            "turns": "all" if args.turns > 1 else "last",
            "sampling": {"max_new_tokens": 4096, "temperature": 0.6},
        },
        "clients": {"shards": args.shards, "concurrency": args.concurrency},
        "output": {"path": str(output)},
    }


def run_side(
    workdir: Path, dataset: Path, tokenizer_dir: Path, args: argparse.Namespace, steal: bool
) -> dict[str, float]:
    """Every shard's worker at once against a fresh simulator; the simulator's occupancy figures."""
    output = workdir / f"out-{'steal' if steal else 'no-steal'}"
    sim, url = start_sim(workdir, args)
    try:
        document = spec(dataset, tokenizer_dir, output, args)
        started = time.monotonic()
        workers = []
        for shard in range(args.shards):
            argv = [
                PYTHON, "-m", "datagen_operator.cli", "worker", "--spec-json", json.dumps(document),
                "--output", str(output), "--server", url, "--shard-index", str(shard), "--shard-count",
                str(args.shards), "--log-format", "json", "--no-compact", "--render-processes", "0",
                *([] if steal else ["--no-steal"]),
            ]  # fmt: skip
            log = (workdir / f"worker-{shard}.log").open("wb")
            workers.append((subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log), log))
        for shard, (proc, log) in enumerate(workers):
            code = proc.wait()
            log.close()
            if code != 0:
                tail = (workdir / f"worker-{shard}.log").read_text()[-2000:]
                raise SystemExit(f"worker {shard} exited {code}: {tail}")
        wall = time.monotonic() - started
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        sim.terminate()
        sim.wait(15)
    figures = {"wall_s": wall}
    names = ("bulk_seconds", "underfilled_seconds", "sending_seconds", "sending_underfilled_seconds")
    for name in (*names, "idle_slot_seconds", "sending_idle_slot_seconds"):
        found = re.search(rf"^sglang_sim:{name}\{{.*\}} (\S+)$", text, re.M)
        if found is None:
            raise SystemExit(f"the simulator reported no sglang_sim:{name}")
        figures[name] = float(found.group(1))
    figures["stolen"] = float(stolen_chunks(workdir, args.shards))
    shutil.rmtree(output, ignore_errors=True)
    return figures


def stolen_chunks(workdir: Path, shards: int) -> int:
    """Chunks the workers said they took from other shards (their `dataset read` log lines)."""
    total = 0
    for shard in range(shards):
        for line in (workdir / f"worker-{shard}.log").read_text().splitlines():
            found = re.search(r"(\d+) chunk\(s\) taken from other shards", line)
            if found:
                total += int(found.group(1))
    return total


def fraction(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=10_000, help="in all, over the shards")
    parser.add_argument("--concurrency", type=int, default=16, help="clients.concurrency, per shard")
    parser.add_argument("--slow-shards", type=int, default=2, help="shards whose prompts (and answers) are long")
    parser.add_argument("--short-words", type=int, default=6)
    parser.add_argument("--long-words", type=int, default=60)
    parser.add_argument("--answer-per-prompt-token", type=float, default=2.0)
    parser.add_argument("--tokens-per-s", type=float, default=400.0, help="each request's decode speed")
    parser.add_argument("--turns", type=int, default=1, help="user turns per line; above 1, regenerated whole")
    parser.add_argument("--sides", default="steal,no_steal", help="which to run, of steal and no_steal")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.shards, args.prompts, args.concurrency, args.slow_shards, args.tokens_per_s = 2, 160, 4, 1, 2000.0

    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="datagen-bench-idle-"))
    results: dict[str, dict[str, float]] = {}
    try:
        dataset = workdir / "prompts.jsonl"
        long_count, short_count = write_dataset(dataset, args)
        print(
            f"{args.shards} shards x concurrency {args.concurrency}, {args.prompts} prompts ({long_count} long in "
            f"{args.slow_shards} shard(s), {short_count} short), {args.turns} turn(s) each, "
            f"{args.tokens_per_s:.0f} tok/s per request",
            flush=True,
        )
        slots = args.shards * args.concurrency
        sides = [side for side in ("steal", "no_steal") if side in args.sides.split(",")]
        for side in sides:
            r = results[side] = run_side(workdir, dataset, tokenizer_dir, args, side == "steal")
            r["idle"] = fraction(r["sending_idle_slot_seconds"], slots * r["sending_seconds"])
            r["idle_to_end"] = fraction(r["idle_slot_seconds"], slots * r["bulk_seconds"])
            strict = fraction(r["sending_underfilled_seconds"], r["sending_seconds"])
            print(
                f"{side.replace('_', '-')}: {100 * r['idle']:.2f} % of {slots} slots x {r['sending_seconds']:.1f} s "
                f"idle while prompts were unsent (goal <= {100 * GOAL:.0f} %); {100 * r['idle_to_end']:.2f} % of "
                f"{r['bulk_seconds']:.1f} s to the last answer; any slot empty {100 * strict:.1f} % of the time; "
                f"wall {r['wall_s']:.1f} s; {r['stolen']:.0f} chunks taken; {load()}",
                flush=True,
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figures = [f"idle_{side}={results[side]['idle']:.4f} (goal <= {GOAL})" for side in results]
    figures += [f"idle_to_last_answer_{side}={results[side]['idle_to_end']:.4f}" for side in results]
    print(" ".join(figures) + f" {load()}")


if __name__ == "__main__":
    main()
