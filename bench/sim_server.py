"""Benchmark: the SGLang simulator's /generate throughput at wire speed, 64 concurrent clients.

    .venv/bin/python bench/sim_server.py [--requests 2000] [--seconds 20] [--concurrency 64]
                                         [--answer-tokens 4096] [--stream] [--quick]

Starts `datagen sim-server` (one process, `--sim-speed wire`: no sleeps) on loopback with fixed-length
Kimi-K2 outputs (reasoning, </think>, answer, <|im_end|>: `--answer-tokens` in all), then sends
pre-tokenized thinking prompts from `--concurrency` aiohttp clients (one session, keep-alive) until
`--requests` are answered or `--seconds` have passed. Each response is parsed with orjson and its
`output_ids` counted. `--stream` measures incremental SSE streaming instead (a server with
--incremental-streaming-output). The simulator's own CPU time is read from /proc, so the CPU cost per
million tokens is reported too: the client shares this machine's cores. Last line:

    sim_tokens_per_s=<n>

This is the ceiling the worker benchmark (bench/worker.py) can reach against the simulator.
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py (the operator benchmark)
# would shadow the standard library's `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import asyncio
import os
import time
from pathlib import Path

import aiohttp
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from datagen_operator.tokenizer.chat_template import kimi_k2_chat_template, render_chat  # noqa: E402
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer  # noqa: E402
from tests.harness.sim import start_sim  # noqa: E402


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prompts(count: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ensure_standin_tokenizer() / "tokenizer.json"))
    template = kimi_k2_chat_template()
    out = []
    for index in range(count):
        question = f"Question {index}: explain, step by step, how a {index % 17}-stage pipeline keeps data safe. " * 8
        text = render_chat(template, [{"role": "user", "content": question}], thinking=True)
        out.append(tokenizer.encode(text, add_special_tokens=False).ids)
    return out


async def load(
    url: str, payloads: list[bytes], requests: int, seconds: float, concurrency: int, stream: bool
) -> tuple[float, int, int]:
    """(elapsed s, tokens, responses) for up to `requests` requests or `seconds`."""
    tokens = responses = 0
    issued = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def lane() -> None:
            nonlocal tokens, responses, issued
            while issued < requests and time.perf_counter() < deadline:
                payload = payloads[issued % len(payloads)]
                issued += 1
                async with session.post(url + "/generate", data=payload, headers=headers) as reply:
                    if reply.status != 200:
                        raise SystemExit(f"HTTP {reply.status}: {(await reply.read())[:300]!r}")
                    if stream:
                        count = 0
                        async for line in reply.content:
                            if line.startswith(b"data: {"):
                                count += len(orjson.loads(line[6:])["output_ids"])
                    else:
                        count = len(orjson.loads(await reply.read())["output_ids"])
                tokens += count
                responses += 1

        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return time.perf_counter() - started, tokens, responses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--answer-tokens", type=int, default=4096)
    parser.add_argument("--stream", action="store_true", help="incremental SSE streaming instead of plain JSON")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seconds, args.concurrency, args.answer_tokens = 64, 5.0, 16, 256

    reasoning = args.answer_tokens // 2
    answer = args.answer_tokens - reasoning - 2  # </think> and <|im_end|> complete the count
    flags = ["--sim-speed", "wire", "--sim-length-sigma", "0", "--log-level", "warning",
             "--sim-mean-reasoning-tokens", str(reasoning), "--sim-mean-answer-tokens", str(answer),
             "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"]  # fmt: skip
    if args.stream:
        flags.append("--incremental-streaming-output")
    sampling = {"max_new_tokens": args.answer_tokens * 2, "temperature": 0.6}
    payloads = [
        orjson.dumps({"input_ids": ids, "sampling_params": sampling, "stream": args.stream}) for ids in prompts(256)
    ]
    with start_sim(*flags) as sim:
        warm_up = 4 if args.stream else args.concurrency
        asyncio.run(load(sim.url, payloads, warm_up, 30.0, args.concurrency, args.stream))
        cpu_before = process_cpu_s(sim.pid)
        seconds, tokens, responses = asyncio.run(
            load(sim.url, payloads, args.requests, args.seconds, args.concurrency, args.stream)
        )
        cpu_after = process_cpu_s(sim.pid)
    mode = "incremental stream" if args.stream else "non-streaming"
    print(f"{responses} {mode} responses, {tokens:,} output tokens in {seconds:.2f} s, {args.concurrency} clients")
    print(f"tokens_per_response={tokens / max(responses, 1):.0f} responses_per_s={responses / seconds:.0f}")
    if cpu_before is not None and cpu_after is not None:
        sim_cpu = cpu_after - cpu_before
        print(f"sim_cpu_s={sim_cpu:.2f} sim_cpu_s_per_million_tokens={sim_cpu / (tokens / 1e6):.3f} "
              f"sim_tokens_per_cpu_s={tokens / sim_cpu:.0f}")  # fmt: skip
    print(f"sim_tokens_per_s={tokens / seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
