"""Benchmark: prefix-cache reuse of whole conversations on N data-parallel servers, against one shared cache.

    .venv/bin/python bench/affinity.py [--servers 4] [--conversations 400] [--turns 4] [--answer-tokens 128]
                                       [--kv-capacity 12000] [--rounds 2] [--quick]

Each server is a simulator process (`datagen sim-server`, GPU pace, its own radix cache of `--kv-capacity`
tokens, SGLang's: prompt and output inserted at finish, LRU leaves evicted under the pool; engine/sim/
prefix_cache.py, held to SGLang's RadixCache by tests/contract/test_radix_cache.py). One `datagen worker`
(concurrency 64) regenerates `--conversations` chats of `--turns` user turns (generation.turns all: turn k+1's
prompt starts with turn k's prompt and the model's answer), in one run of this script, against:
- shared: ONE server whose cache is `servers x kv-capacity` tokens: what one shared cache of the same total size
  reaches (the reference);
- affinity: `servers` servers of `kv-capacity` each, picked as the worker picks (engine/client/pool.py: a
  conversation's turns go to the server of its last answer, bounded load);
- least-loaded: the same servers, each request to the server with fewest in flight (the pick before affinity,
  the worker run with `pick` ignoring the key), about 1/N of the reference;
and single-turn prompts (the same user turns, one a line) on the `servers` servers, with the worker as it is and
with the least-loaded pick: the throughput ratio (single-turn requests carry no key: the same pick).
Cached prompt tokens / prompt tokens and each server's work (prompt + output tokens) come from each simulator's
/metrics (`sglang:prompt_tokens_total`, `sglang:cache_hit_rate`, `sglang:generation_tokens_total`). The five
runs are repeated `--rounds` times, alternated; medians. Last line:

    affinity_vs_shared=<r> (goal >= 0.95) load_spread=<s> (goal <= 0.20) single_turn_vs_before=<t> (goal >= 1.0)
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.harness: the simulators are started as the tests start them
PYTHON = sys.executable
LEAST_LOADED = (
    "import runpy, sys\n"
    "from datagen_operator.engine.client import pool\n"
    "pick = pool.EndpointPool.pick\n"
    "pool.EndpointPool.pick = lambda self, key=None: pick(self)\n"
    "sys.argv = ['datagen', *sys.argv[1:]]\n"
    "runpy.run_module('datagen_operator.cli', run_name='__main__')\n"
)
"""The worker with the pick before affinity: every request to the up server with fewest in flight."""


def sim_flags(capacity: int, answer_tokens: int, tokens_per_s: float) -> list[str]:
    return [
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-metrics",
        "--sim-speed", "gpu", "--sim-tokens-per-s", str(tokens_per_s), "--sim-ttft-s", "0.02",
        "--sim-batch-capacity", "1024", "--sim-kv-capacity", str(capacity),
        "--sim-mean-reasoning-tokens", str(answer_tokens // 2),
        "--sim-mean-answer-tokens", str(answer_tokens - answer_tokens // 2),
        "--sim-length-sigma", "0", "--log-level", "warning",
    ]  # fmt: skip


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def served(url: str) -> tuple[float, float, float]:
    """(prompt tokens, cached prompt tokens, prompt + output tokens) the server processed."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    prompt = metric(text, "sglang:prompt_tokens_total")
    generated = metric(text, "sglang:generation_tokens_total")
    return prompt, prompt * metric(text, "sglang:cache_hit_rate"), prompt + generated


def datasets(workdir: Path, conversations: int, turns: int) -> tuple[Path, Path]:
    whole, single = workdir / "conversations.jsonl", workdir / "single.jsonl"
    with whole.open("wb") as chats, single.open("wb") as lines:
        for c in range(conversations):
            messages: list[dict[str, str]] = []
            for t in range(turns):
                question = f"Conversation {c}, question {t + 1}: explain step {t + 1} of plan {c} in detail, please."
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": "(dataset)"}]
                line = {"id": f"s{c:05d}-{t}", "messages": [{"role": "user", "content": question}]}
                lines.write(orjson.dumps(line) + b"\n")
            chats.write(orjson.dumps({"id": f"c{c:05d}", "messages": messages}) + b"\n")
    return whole, single


def run_worker(dataset: Path, turns: str, output: Path, urls: list[str], args: Any, before: bool) -> tuple[float, int]:
    """One `datagen worker` process: (generation seconds, output tokens)."""
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    document = {
        "model": {"preset": "kimi-k2.5", "path": str(ensure_standin_tokenizer())},
        "dataset": {"path": str(dataset)},
        "generation": {"turns": turns, "sampling": {"max_new_tokens": args.answer_tokens * 2, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": args.concurrency},
        "output": {"path": str(output)},
    }
    command = [PYTHON, "-c", LEAST_LOADED] if before else [PYTHON, "-m", "datagen_operator.cli"]
    argv = [*command, "worker", "--spec-json", json.dumps(document), "--output", str(output),
            "--log-format", "json", "--no-compact"] + [flag for url in urls for flag in ("--server", url)]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        code = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log).returncode
        log.seek(0)
        text = log.read().decode()
    shutil.rmtree(output, ignore_errors=True)
    if code != 0:
        raise SystemExit(f"worker exited {code}: {text[-2000:]}")
    for line in text.splitlines():
        if line.startswith("{") and "generation_s" in line:
            entry = json.loads(line)
            return float(entry["generation_s"]), int(entry["output_tokens_this_run"])
    raise SystemExit("the worker logged no generation phase")


def measure(workdir: Path, name: str, servers: int, capacity: int, dataset: Path, turns: str, args: Any,
            before: bool = False) -> dict[str, Any]:  # fmt: skip
    from tests.harness.sim import start_sims

    flags = sim_flags(capacity, args.answer_tokens, args.tokens_per_s)
    with start_sims([flags] * servers, timeout_s=120) as sims:
        urls = [sim.url for sim in sims]
        seconds, tokens = run_worker(dataset, turns, workdir / f"out-{name}", urls, args, before)
        figures = [served(url) for url in urls]
    prompt = sum(f[0] for f in figures)
    cached = sum(f[1] for f in figures)
    work = [f[2] for f in figures]
    mean = sum(work) / len(work)
    result = {
        "hit": cached / prompt if prompt else 0.0,
        "spread": max(abs(w - mean) for w in work) / mean if mean else 0.0,
        "tok_s": tokens / seconds,
    }
    print(f"{name}: {servers} server(s) x {capacity} KV tokens: cached/prompt {result['hit']:.3f} "
          f"({cached:,.0f}/{prompt:,.0f}), per-server work {[round(w) for w in work]} "
          f"(max off the mean {result['spread']:.1%}), {tokens / seconds:,.0f} output tok/s", flush=True)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--kv-capacity", type=int, default=12000, help="each server's max_total_num_tokens")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens-per-s", type=float, default=1000.0, help="each request's decode speed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.conversations, args.turns, args.answer_tokens, args.concurrency, args.rounds = 24, 2, 16, 16, 1

    workdir = Path(tempfile.mkdtemp(prefix="datagen-bench-affinity-"))
    n, capacity = args.servers, args.kv_capacity
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        whole, single = datasets(workdir, args.conversations, args.turns)
        for round_index in range(args.rounds):  # alternated, so a change of load on the machine hits both sides
            print(f"round {round_index + 1}:", flush=True)
            for name, servers, size, dataset, turns, before in (
                ("shared", 1, n * capacity, whole, "all", False),
                ("affinity", n, capacity, whole, "all", False),
                ("least-loaded", n, capacity, whole, "all", True),
                ("single-turn", n, capacity, single, "last", False),
                ("single-turn least-loaded", n, capacity, single, "last", True),
            ):
                runs.setdefault(name, []).append(measure(workdir, name, servers, size, dataset, turns, args, before))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def median(name: str, figure: str) -> float:
        return statistics.median(run[figure] for run in runs[name])

    shared, affinity, before = median("shared", "hit"), median("affinity", "hit"), median("least-loaded", "hit")
    single_ratio = median("single-turn", "tok_s") / median("single-turn least-loaded", "tok_s")
    print(f"cached/prompt (medians): shared {shared:.3f}, affinity {affinity:.3f}, least-loaded {before:.3f} "
          f"({before / shared:.2f} of shared; the history alone would be 1/N = {1 / n:.2f}, the template's "
          f"common head is cached everywhere); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(
        f"affinity_vs_shared={affinity / shared:.3f} (goal >= 0.95) "
        f"load_spread={median('affinity', 'spread'):.3f} (goal <= 0.20) "
        f"single_turn_vs_before={single_ratio:.3f} (goal >= 1.0)"
    )


if __name__ == "__main__":
    main()
