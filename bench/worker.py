"""Benchmark: `datagen worker` against a minimal aiohttp client doing the same work, same simulator, one run.

    .venv/bin/python bench/worker.py [--prompts 3000] [--answer-tokens 4096] [--concurrency 64] [--rounds 3] [--quick]

Starts the SGLang simulator (one process, wire speed: no sleeps) on loopback, with fixed 4k-token
answers (reasoning + answer, lognormal sigma 0). Then `--rounds` triples, back to back:
- baseline: the minimal client doing the worker's work from the same dataset: each prompt rendered in its
  event loop when its lane sends it, with the worker's own `Renderer` (the model's template, the same
  ids), the worker's request (the same sampling_params: the spec's and the stop ids the worker adds)
  POSTed to /generate at the same concurrency, each response parsed with orjson and discarded (no checks,
  nothing stored);
- HTTP-only baseline: the same client with every prompt rendered before the clock starts (its cost of
  HTTP and parsing alone), printed for reference: the worker renders as it goes, so this one does less;
- worker: `datagen worker` as ONE subprocess into a fresh output directory with --no-compact, then a
  second invocation that only compacts.
Every side is timed by one observer, the simulator's own `sglang:generation_tokens_total` counter
sampled every 50 ms, over the same steady-state window: from 10 % to 90 % of the run's output tokens
(start-up and the tail where lanes run dry are outside it for all). Each triple gives the ratios; the
medians are reported (the machine is shared: runs taken back to back see the same load), with the load
average before and after. Prints, last line:

    worker_vs_baseline=<ratio> worker_tokens_per_s=<n> parquet_bytes_per_token=<x>

and before it `worker_vs_http_only_baseline=`, CPU seconds per million stored tokens (generation,
compaction) and JSONL bytes per token. "Stored tokens" are input_ids + output_ids of every record.
"""

from __future__ import annotations

import sys

# `python bench/worker.py` puts bench/ first on sys.path, where a sibling benchmark's module name
# (bench/operator.py) would shadow the standard library's `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def start_sim(workdir: Path, answer_tokens: int) -> tuple[subprocess.Popen[bytes], str]:
    port_file = workdir / "sim.port"
    half = answer_tokens // 2
    cmd = [
        PYTHON, "-m", "datagen_operator.cli", "sim-server", "--port", "0", "--sim-port-file", str(port_file),
        "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-speed", "wire",
        "--sim-mean-reasoning-tokens", str(half), "--sim-mean-answer-tokens", str(answer_tokens - half),
        "--sim-length-sigma", "0", "--enable-metrics", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"simulator did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{int(port_file.read_text().strip())}"


class TokenWatch:
    """The simulator's generated-token counter, sampled every 50 ms in a thread while a side runs."""

    def __init__(self, url: str, first: tuple[float, float] | None = None) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        # The first sample is taken before the side starts (or given: `first`, read before a side that is
        # watched only from its first request): a thread's first read can come late on a loaded machine, after a
        # short (--quick) side has finished, leaving nothing counted between samples.
        self.samples.append(first or self.sample())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> tuple[float, float]:
        return time.perf_counter(), self._read()

    def _read(self) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        match = re.search(r"^sglang:generation_tokens_total(?:{[^}]*})? ([0-9.e+]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._read()))
            self._stop.wait(0.05)

    def steady_rate(self, low: float = 0.1, high: float = 0.9) -> float:
        """Tokens per second between the moments `low` and `high` of this run's tokens were done."""
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter(), self._read()))
        base, total = self.samples[0][1], self.samples[-1][1] - self.samples[0][1]

        def crossing(share: float) -> float:
            target = base + share * total
            for (t0, c0), (t1, c1) in zip(self.samples, self.samples[1:], strict=False):
                if c1 >= target:
                    return t1 if c1 == c0 else t0 + (t1 - t0) * (target - c0) / (c1 - c0)
            return self.samples[-1][0]

        span = crossing(high) - crossing(low)
        if total <= 0 or span <= 0:
            # Too few samples for a steady window (a --quick side lasts a few hundred ms): the whole run's rate.
            return total / max(self.samples[-1][0] - self.samples[0][0], 1e-9)
        return (high - low) * total / span


def load_text() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_dataset(path: Path, prompts: int) -> None:
    with path.open("wb") as file:
        for i in range(prompts):
            question = f"Question {i}: explain, step by step, how a {i % 17}-stage pipeline keeps its data safe."
            file.write(orjson.dumps({"id": f"q{i:06d}", "messages": [{"role": "user", "content": question}]}) + b"\n")


def render_all(dataset: Path, tokenizer_dir: Path) -> list[list[int]]:
    """Every prompt of the dataset as the worker renders it."""
    renderer, _ = renderer_and_params(dataset, tokenizer_dir, 8192)
    return [renderer.render(orjson.loads(line)["messages"], None) for line in dataset.read_bytes().splitlines()]


def renderer_and_params(dataset: Path, tokenizer_dir: Path, max_new_tokens: int) -> tuple[Any, dict]:
    """The worker's Renderer (its tokenizer, template and variables) and the sampling_params its requests
    carry (the spec's and the stop ids the records are checked against): the baseline sends exactly the
    worker's requests."""
    from datagen_operator.api import parse_spec
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.checks.record_checks import expectations_for
    from datagen_operator.engine.model_configs import read_model_eos_ids
    from datagen_operator.engine.requests import run_sampling
    from datagen_operator.prompts.render import Renderer, load_tokenizer, template_variables

    spec = parse_spec(_spec(dataset, tokenizer_dir, Path("/unused"), max_new_tokens, 1))
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=resolved.trust_remote_code)
    expect = expectations_for(resolved, tokenizer, read_model_eos_ids(tokenizer_dir))
    return Renderer(tokenizer, template_variables(resolved)), run_sampling(
        spec.generation.sampling, expect.stop_token_ids
    )


def _spec(dataset: Path, tokenizer_dir: Path, output: Path, max_new_tokens: int, concurrency: int) -> dict:
    return {
        "model": {"preset": "kimi-k2.5", "path": str(tokenizer_dir)},
        "dataset": {"path": str(dataset)},
        "generation": {"sampling": {"max_new_tokens": max_new_tokens, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": concurrency},
        "output": {"path": str(output)},
    }


async def baseline(
    url: str, chats: list[list[dict]], params: dict, concurrency: int, render: Callable[[list[dict]], list[int]]
) -> tuple[float, int]:
    """The minimal client: each chat rendered with `render` in the event loop, sent as the worker's request
    (same input_ids, same sampling_params), the response parsed and discarded."""
    tokens = 0
    queue = iter(chats)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def lane() -> None:
            nonlocal tokens
            for messages in queue:
                payload = orjson.dumps({"input_ids": render(messages), "sampling_params": params})
                async with session.post(
                    url + "/generate", data=payload, headers={"Content-Type": "application/json"}
                ) as response:
                    body = orjson.loads(await response.read())
                tokens += len(body["output_ids"])

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return time.perf_counter() - started, tokens


def run_worker(spec: dict, url: str, extra: list[str]) -> tuple[float, float, list[dict]]:
    """One `datagen worker` process: (wall seconds, CPU seconds, its JSON log lines)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(
        [PYTHON, "-m", "datagen_operator.cli", "worker", "--spec-json", json.dumps(spec), "--output",
         spec["output"]["path"], "--server", url, "--log-format", "json", *extra],
        cwd=REPO, capture_output=True, check=False,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    logs = [json.loads(line) for line in result.stderr.decode().splitlines() if line.startswith("{")]
    if result.returncode != 0:
        raise SystemExit(f"worker exited {result.returncode}: {result.stderr.decode()[-2000:]}")
    return wall, cpu, logs


def generation_stats(logs: list[dict]) -> tuple[float, float, int]:
    """(seconds, CPU seconds of the worker's event loop process, output tokens) of the generation phase."""
    for entry in logs:
        if "generation_s" in entry:
            return entry["generation_s"], entry["generation_cpu_s"], entry["output_tokens_this_run"]
    raise SystemExit("the worker did not log its generation phase")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=3000)
    parser.add_argument("--answer-tokens", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.answer_tokens, args.concurrency, args.rounds = 96, 256, 16, 1

    from datagen_operator.output.layout import OutputLayout
    from datagen_operator.output.readers import iter_records
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="bench-worker-"))
    sim, url = start_sim(workdir, args.answer_tokens)
    try:
        dataset = workdir / "prompts.jsonl"
        write_dataset(dataset, args.prompts)
        max_new = args.answer_tokens * 2
        renderer, params = renderer_and_params(dataset, tokenizer_dir, max_new)
        chats = [orjson.loads(line)["messages"] for line in dataset.read_bytes().splitlines()]
        rendered = {id(chat): renderer.render(chat, None) for chat in chats}

        def render_inline(messages: list[dict]) -> list[int]:
            return renderer.render(messages, None)

        def pre_rendered(messages: list[dict]) -> list[int]:
            return rendered[id(messages)]

        asyncio.run(baseline(url, chats[: args.concurrency], params, args.concurrency, pre_rendered))  # warm-up
        print(load_text(), flush=True)
        base_rates: list[float] = []
        http_rates: list[float] = []
        worker_rates: list[float] = []
        ratios: list[float] = []
        http_ratios: list[float] = []
        runs: list[dict] = []
        for round_index in range(args.rounds):
            watch = TokenWatch(url)
            asyncio.run(baseline(url, chats, params, args.concurrency, pre_rendered))
            http_rates.append(watch.steady_rate())
            cpu_before, sim_before = time.process_time(), process_cpu_s(sim.pid)
            watch = TokenWatch(url)
            seconds, tokens = asyncio.run(baseline(url, chats, params, args.concurrency, render_inline))
            base_rates.append(watch.steady_rate())
            base_whole = tokens / seconds
            base_cpu, base_sim_cpu = time.process_time() - cpu_before, process_cpu_s(sim.pid) - sim_before
            output = workdir / f"out-{round_index}"
            spec = _spec(dataset, tokenizer_dir, output, max_new, args.concurrency)
            sim_before = process_cpu_s(sim.pid)
            watch = TokenWatch(url)
            wall, cpu, logs = run_worker(spec, url, ["--no-compact"])
            worker_rates.append(watch.steady_rate())
            ratios.append(worker_rates[-1] / base_rates[-1])
            http_ratios.append(worker_rates[-1] / http_rates[-1])
            worker_sim_cpu = process_cpu_s(sim.pid) - sim_before
            gen_s, gen_cpu, gen_tokens = generation_stats(logs)
            layout = OutputLayout(output)
            jsonl_bytes = sum(p.stat().st_size for p in layout.segments(0))
            c_wall, c_cpu, _ = run_worker(spec, url, [])
            parquet = layout.parquet(0, 1)
            stored = sum(len(r["input_ids"]) + len(r["output_ids"]) for r in iter_records(output))
            runs.append(
                {"wall": wall, "cpu": cpu, "jsonl": jsonl_bytes, "compact_wall": c_wall, "compact_cpu": c_cpu,
                 "parquet": parquet.stat().st_size, "stored": stored, "gen_s": gen_s, "gen_tokens": gen_tokens,
                 "gen_cpu": gen_cpu, "base_cpu": base_cpu, "base_tokens": tokens, "base_sim_cpu": base_sim_cpu,
                 "worker_sim_cpu": worker_sim_cpu}
            )  # fmt: skip
            print(
                f"round {round_index}: baseline {base_rates[-1]:,.0f} tok/s (HTTP only {http_rates[-1]:,.0f}), "
                f"worker {worker_rates[-1]:,.0f} tok/s (steady window), ratio {ratios[-1]:.3f} "
                f"(to the HTTP-only baseline {http_ratios[-1]:.3f}); baseline whole run {base_whole:,.0f} tok/s, worker whole generation phase {gen_tokens / gen_s:,.0f} "
                f"tok/s ({gen_s:.2f}s of {wall:.2f}s wall incl. start-up); compaction run {c_wall:.2f}s; "
                f"{load_text()}",
                flush=True,
            )
            if round_index < args.rounds - 1:
                shutil.rmtree(output)
        run = runs[-1]
        stored_m = run["stored"] / 1e6
        print(f"stored tokens per run: {run['stored']:,} ({args.prompts} records)")
        print(
            f"worker_cpu_s_per_million_stored_tokens={run['cpu'] / stored_m:.3f} "
            "(worker process and its render helper, whole run incl. start-up)"
        )
        print(
            f"generation_cpu_s_per_million_output_tokens={run['gen_cpu'] / (run['gen_tokens'] / 1e6):.3f} "
            f"(worker event loop during generation; baseline client: "
            f"{run['base_cpu'] / (run['base_tokens'] / 1e6):.3f})"
        )
        print(
            f"simulator_cpu_s_per_million_output_tokens: serving the baseline "
            f"{run['base_sim_cpu'] / (run['base_tokens'] / 1e6):.3f}, serving the worker "
            f"{run['worker_sim_cpu'] / (run['gen_tokens'] / 1e6):.3f} (same machine, {os.cpu_count()} cores)"
        )
        print(f"compaction_cpu_s_per_million_stored_tokens={run['compact_cpu'] / stored_m:.3f} (incl. start-up)")
        print(f"jsonl_bytes_per_token={run['jsonl'] / run['stored']:.3f}")
        print(f"baseline_tokens_per_s={statistics.median(base_rates):.0f} (median of {args.rounds}, steady window)")
        print(f"ratios: {', '.join(f'{r:.3f}' for r in ratios)}; {load_text()}")
        print(
            f"worker_vs_http_only_baseline={statistics.median(http_ratios):.3f} (the client with every prompt "
            f"rendered before the clock: {', '.join(f'{r:.3f}' for r in http_ratios)})"
        )
        print(
            f"worker_vs_baseline={statistics.median(ratios):.3f} "
            f"worker_tokens_per_s={statistics.median(worker_rates):.0f} "
            f"parquet_bytes_per_token={run['parquet'] / run['stored']:.3f}"
        )
    finally:
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
