"""Benchmark: whole conversations (generation.turns all) against single-turn prompts of the same user turns.

    .venv/bin/python bench/multiturn.py [--conversations 1000] [--turns 4] [--answer-tokens 256] [--rounds 2] [--quick]

Starts the SGLang simulator on loopback at GPU pace (`--sim-speed gpu`: each request decodes at
`--tokens-per-s`, as a GPU server does, so the figure is whether the client keeps `clients.concurrency` requests
in flight, not how fast it moves bytes), fixed answer lengths. Then `--rounds` pairs, back to back:
- single: `datagen worker` over `conversations x turns` one-turn prompts, each one user message of the
  conversations' (one answer a line);
- conversations: `datagen worker` over the `conversations` conversations of `turns` user turns each with
  generation.turns all: each turn sent as soon as the answer before it is recorded, its prompt rendered with
  the model's own earlier answers (so later prompts are longer than the single ones: the comparison is the
  client's cost of whole conversations, not equal work).
Each worker is one subprocess into a fresh output directory with --no-compact; its throughput is its own log's
generation phase (output tokens / seconds), its peak RSS from wait4. Prints the medians, last line:

    conversations_vs_single=<ratio> (goal >= 0.9) rss_conversations_vs_single=<ratio> (goal <= 1.10)
"""

from __future__ import annotations

import sys

# `python bench/multiturn.py` puts bench/ first on sys.path, where a sibling benchmark's module name
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
import time
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def start_sim(workdir: Path, answer_tokens: int, tokens_per_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "sim.port"
    half = answer_tokens // 2
    pace = ["--sim-speed", "gpu", "--sim-tokens-per-s", str(tokens_per_s), "--sim-ttft-s", "0.05",
            "--sim-batch-capacity", "1024"]  # fmt: skip
    cmd = [
        PYTHON, "-m", "datagen_operator.cli", "sim-server", "--port", "0", "--sim-port-file", str(port_file),
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", *pace,
        "--sim-mean-reasoning-tokens", str(half), "--sim-mean-answer-tokens", str(answer_tokens - half),
        "--sim-length-sigma", "0", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"simulator did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{int(port_file.read_text().strip())}"


def datasets(workdir: Path, conversations: int, turns: int) -> tuple[Path, Path]:
    """The same user turns twice: as conversations (with the dataset's own answers, never sent) and one a line."""
    whole, single = workdir / "conversations.jsonl", workdir / "single.jsonl"
    with whole.open("wb") as chats, single.open("wb") as lines:
        for c in range(conversations):
            messages: list[dict[str, str]] = []
            for t in range(turns):
                question = f"Conversation {c}, question {t + 1}: explain step {t + 1} of the plan in detail."
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": "(dataset)"}]
                line = {"id": f"s{c:05d}-{t}", "messages": [{"role": "user", "content": question}]}
                lines.write(orjson.dumps(line) + b"\n")
            chats.write(orjson.dumps({"id": f"c{c:05d}", "messages": messages}) + b"\n")
    return whole, single


def spec(
    dataset: Path, tokenizer_dir: Path, output: Path, turns: str, concurrency: int, max_new: int
) -> dict[str, Any]:
    return {
        "model": {"preset": "kimi-k2.5", "path": str(tokenizer_dir)},
        "dataset": {"path": str(dataset)},
        "generation": {"turns": turns, "sampling": {"max_new_tokens": max_new, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": concurrency},
        "output": {"path": str(output)},
    }


def run_worker(document: dict[str, Any], url: str) -> tuple[float, int, int]:
    """One `datagen worker` process: (generation seconds, output tokens, peak RSS in KiB)."""
    argv = [
        PYTHON, "-m", "datagen_operator.cli", "worker", "--spec-json", json.dumps(document), "--output",
        document["output"]["path"], "--server", url, "--log-format", "json", "--no-compact",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"worker exited {proc.returncode}: {text[-2000:]}")
    for line in text.splitlines():
        if line.startswith("{") and "generation_s" in line:
            entry = json.loads(line)
            return float(entry["generation_s"]), int(entry["output_tokens_this_run"]), int(usage.ru_maxrss)
    raise SystemExit("the worker logged no generation phase")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens-per-s", type=float, default=400.0, help="each request's decode speed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.turns, args.answer_tokens, args.concurrency, args.rounds = 24, 2, 32, 16, 1

    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="datagen-bench-multiturn-"))
    max_new = args.answer_tokens * 2
    throughput: dict[str, list[float]] = {"single": [], "conversations": []}
    rss: dict[str, list[int]] = {"single": [], "conversations": []}
    try:
        whole, single = datasets(workdir, args.conversations, args.turns)
        sim, url = start_sim(workdir, args.answer_tokens, args.tokens_per_s)
        try:
            for round_index in range(args.rounds):
                for side, dataset, turns in (("single", single, "last"), ("conversations", whole, "all")):
                    output = workdir / f"out-{side}-{round_index}"
                    seconds, tokens, peak = run_worker(
                        spec(dataset, tokenizer_dir, output, turns, args.concurrency, max_new), url
                    )
                    throughput[side].append(tokens / seconds)
                    rss[side].append(peak)
                    print(f"round {round_index + 1} {side}: {tokens} output tokens in {seconds:.2f}s = "
                          f"{tokens / seconds:,.0f} tok/s, peak RSS {peak / 1024:.0f} MiB", flush=True)  # fmt: skip
                    shutil.rmtree(output, ignore_errors=True)
        finally:
            sim.terminate()
            sim.wait(15)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = statistics.median(throughput["conversations"]) / statistics.median(throughput["single"])
    rss_ratio = statistics.median(rss["conversations"]) / statistics.median(rss["single"])
    print(
        f"conversations_vs_single={ratio:.2f} (goal >= 0.9) rss_conversations_vs_single={rss_ratio:.2f} (goal <= 1.10)"
    )


if __name__ == "__main__":
    main()
