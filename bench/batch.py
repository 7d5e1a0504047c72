"""Benchmark: throughput against clients.concurrency on a simulator with SGLang's scheduling limits, and
`clients.concurrency: auto` (the canary's choice, checks/batch_fill.py) against the best fixed one.

    .venv/bin/python bench/batch.py [--max-running-requests 64] [--concurrency 8,16,32,64,128,256] [--waves 8]
                                    [--rounds 3] [--quick]

Starts the SGLang simulator on loopback at GPU pace (`--sim-speed gpu`: each request decodes at `--tokens-per-s`)
with `--max-running-requests` (as SGLang resolves it: more requests wait in its queue), fixed answer lengths.
For each concurrency, one `datagen worker` over the same prompts, `--waves` full batches of the server's; its throughput is its
own log's generation phase (output tokens / seconds). The auto choice, from the simulator's /server_info as the
canary reads and resolves it (engine/limits.batch_limits, checks/batch_fill.auto_concurrency: the number its
warning suggests), runs beside them as an auto run's worker does (spec `auto`, the number as `--concurrency`; the
worker must say it sends at it). `--rounds` passes, each in the other order; the figures are each setting's
median. Last line:

    auto=<n> auto_vs_best=<ratio> (goal >= 0.95) best=<concurrency> c8_vs_best=<ratio> ... load=<1 min>
"""

from __future__ import annotations

import sys

# `python bench/batch.py` puts bench/ first on sys.path, where a sibling benchmark's module name
# (bench/operator.py) would shadow the standard library's `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.harness: the simulators are started as the tests start them
PYTHON = sys.executable


def sim_flags(max_running: int, answer_tokens: int, tokens_per_s: float) -> list[str]:
    half = answer_tokens // 2
    return [
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-speed", "gpu",
        "--sim-tokens-per-s", str(tokens_per_s), "--sim-ttft-s", "0.05", "--max-running-requests", str(max_running),
        "--sim-mean-reasoning-tokens", str(half), "--sim-mean-answer-tokens", str(answer_tokens - half),
        "--sim-length-sigma", "0", "--log-level", "warning",
    ]  # fmt: skip


def prompts(path: Path, count: int) -> Path:
    with path.open("wb") as lines:
        for index in range(count):
            line = {"id": f"p{index:06d}", "messages": [{"role": "user", "content": f"Question {index}: explain."}]}
            lines.write(orjson.dumps(line) + b"\n")
    return path


def run_worker(
    dataset: Path, tokenizer_dir: Path, output: Path, concurrency: int, max_new: int, url: str, *, auto: bool = False
) -> float:
    """One `datagen worker` process over `dataset`: its generation phase's output tokens per second. `auto`: the
    spec says `clients.concurrency: auto` and the worker gets the canary's number as the shells pass it
    (`--concurrency`), and must say it sends at it."""
    document = {
        "model": {"preset": "kimi-k2.5", "path": str(tokenizer_dir)},
        "dataset": {"path": str(dataset)},
        "generation": {"sampling": {"max_new_tokens": max_new, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": "auto" if auto else concurrency},
        "output": {"path": str(output)},
    }
    argv = [
        PYTHON, "-m", "datagen_operator.cli", "worker", "--spec-json", json.dumps(document), "--output",
        str(output), "--server", url, "--log-format", "json", "--no-compact",
        *(["--concurrency", str(concurrency)] if auto else []),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker exited {done.returncode}: {done.stderr[-2000:]}")
    entries = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    sent_at = {entry["concurrency"] for entry in entries if "concurrency" in entry}
    if sent_at != {concurrency}:
        raise SystemExit(f"the worker said it sends at {sorted(sent_at)}, not {concurrency}")
    for entry in entries:
        if "generation_s" in entry:
            return int(entry["output_tokens_this_run"]) / float(entry["generation_s"])
    raise SystemExit("the worker logged no generation phase")


def auto_choice(url: str, shards: int = 1) -> int:
    """`clients.concurrency: auto` as the canary resolves it (checks/batch_fill.auto_concurrency, the rule of its
    warning's suggestion) from the simulator's /server_info."""
    from datagen_operator.checks.batch_fill import auto_concurrency
    from datagen_operator.engine.limits import batch_limits

    with urllib.request.urlopen(url + "/server_info", timeout=30) as reply:
        limits = batch_limits(orjson.loads(reply.read()))
    if limits is None:
        raise SystemExit("the simulator's /server_info has no effective_max_running_requests_per_dp")
    return auto_concurrency(shards, [limits]).concurrency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-running-requests", type=int, default=64)
    parser.add_argument("--concurrency", default="8,16,32,64,128,256", help="fixed settings, comma-separated")
    parser.add_argument("--waves", type=int, default=8, help="full batches of prompts per setting")
    parser.add_argument("--rounds", type=int, default=3, help="passes over every setting; medians are printed")
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--tokens-per-s", type=float, default=400.0, help="each request's decode speed")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.max_running_requests, args.concurrency, args.waves, args.answer_tokens = 16, "8,16,64", 4, 32
        args.rounds = 1
    fixed = [int(c) for c in args.concurrency.split(",")]

    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
    from tests.harness.sim import start_sim

    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="datagen-bench-batch-"))
    runs: dict[int, list[float]] = {}
    try:
        flags = sim_flags(args.max_running_requests, args.answer_tokens, args.tokens_per_s)
        with start_sim(*flags, timeout_s=120) as sim:
            url = sim.url
            auto = auto_choice(url)
            settings = sorted({*fixed, auto})
            # The same prompts for every setting: `waves` full batches of the server's.
            count = args.waves * args.max_running_requests
            dataset = prompts(workdir / "prompts.jsonl", count)
            for round_index in range(args.rounds):
                for concurrency in settings if round_index % 2 == 0 else settings[::-1]:
                    output = workdir / f"out-{concurrency}-{round_index}"
                    rate = run_worker(
                        dataset,
                        tokenizer_dir,
                        output,
                        concurrency,
                        args.answer_tokens * 2,
                        url,
                        auto=concurrency == auto,
                    )
                    runs.setdefault(concurrency, []).append(rate)
                    mark = " (auto)" if concurrency == auto else ""
                    print(f"round {round_index + 1} concurrency {concurrency}{mark}: {count} prompts, {rate:,.0f} tok/s",
                          flush=True)  # fmt: skip
                    shutil.rmtree(output, ignore_errors=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    throughput = {concurrency: statistics.median(rates) for concurrency, rates in runs.items()}
    for concurrency in settings:
        print(f"concurrency {concurrency}: median {throughput[concurrency]:,.0f} tok/s")
    best = max(fixed, key=lambda c: throughput[c])
    ratios = " ".join(f"c{c}_vs_best={throughput[c] / throughput[best]:.3f}" for c in fixed if c != best)
    print(
        f"auto={auto} auto_vs_best={throughput[auto] / throughput[best]:.3f} (goal >= 0.95) best={best} "
        f"{ratios} load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
