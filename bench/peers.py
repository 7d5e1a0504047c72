"""Benchmark: `datagen worker` against two peers on one simulator, same prompts, side by side in one run.

    .venv/bin/python bench/peers.py [--prompts 600] [--answer-tokens 2048] [--concurrency 64] [--rounds 3] [--quick]

Peers, each sending the same prompts at the same concurrency to the same simulator (wire speed, fixed
`--answer-tokens` answers):
- sglang_bench_serving: SGLang's own benchmark client, `async_request_sglang_generate` of
  `sglang.benchmark.serving` (what `python -m sglang.bench_serving --backend sglang` sends), imported from
  the pinned wheel (tests/contract/wheel.py) behind the GPU-package stubs (tests/contract/sglang_stubs.py),
  in its own process, driven as its `benchmark()` drives it: one task per request under a semaphore of
  `--concurrency`, request rate unlimited. Pre-tokenized prompts (`input_ids`), EOS honoured
  (`--disable-ignore-eos`) so the answers are the worker's, `--disable-stream` (one body per answer, as
  the worker asks). `--with-stream` also runs it in its default streaming mode, printed apart: the
  simulator, like SGLang without --incremental-streaming-output, then streams cumulative chunks, O(n^2)
  bytes per answer (about 1 % of the worker's rate with 2,048-token answers, minutes a round).
- openai_client: the `openai` package's `AsyncOpenAI`, `chat.completions.create` with the dataset's
  messages and the preset's chat-template switches, `--concurrency` lanes: how generation scripts commonly
  call a server (it gets text back, not token ids).
- the worker: `datagen worker --no-compact`, one shard, into a fresh output.
Every side is timed by the same observer, the simulator's `sglang:generation_tokens_total`, over the same
steady-state window (10 % to 90 % of the side's tokens; bench/worker.py's TokenWatch). Sides run back to
back in rounds (worker, bench_serving, openai), and each round gives the worker's ratio to each peer; the
median over rounds is reported. Last line:

    vs_sglang_bench_serving=<ratio> vs_openai_client=<ratio>
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import asyncio
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
sys.path.insert(0, str(REPO))

from bench.worker import TokenWatch, _spec, load_text, render_all, run_worker, start_sim, write_dataset  # noqa: E402

PYTHON = sys.executable


def sglang_child(payload_file: str, url: str, concurrency: int, max_new_tokens: int, stream: bool) -> None:
    """In a child process: SGLang's bench_serving request function over the prompts in `payload_file`."""
    from transformers.utils import import_utils

    import_utils.is_torch_available()  # transformers runs as without torch (tests/contract/sglang_side.py)
    from tests.contract.sglang_stubs import install_stubs
    from tests.contract.wheel import unpacked_sglang

    install_stubs()
    sys.path.insert(0, str(unpacked_sglang()))
    from sglang.benchmark import serving

    # The globals its request function reads, as `python -m sglang.bench_serving --backend sglang
    # --disable-ignore-eos --temperature 0.6 [--disable-stream]` sets them.
    serving.args = argparse.Namespace(
        temperature=0.6, top_p=1.0, disable_ignore_eos=True, disable_stream=not stream, return_logprob=False,
        return_routed_experts=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None,
        cache_report=False,
    )  # fmt: skip
    prompts: list[list[int]] = orjson.loads(Path(payload_file).read_bytes())
    inputs = [
        serving.RequestFuncInput(
            prompt=ids,
            api_url=url + "/generate",
            prompt_len=len(ids),
            output_len=max_new_tokens,
            model="",
            lora_name=None,
            image_data=None,
            extra_request_body={},
        )
        for ids in prompts
    ]

    async def run() -> list[Any]:
        semaphore = asyncio.Semaphore(concurrency)

        async def limited(request: Any) -> Any:
            async with semaphore:
                return await serving.async_request_sglang_generate(request)

        return await asyncio.gather(*(limited(r) for r in inputs))

    outputs = asyncio.run(run())
    failed = [o.error for o in outputs if not o.success]
    sys.stdout.write(orjson.dumps({"ok": len(outputs) - len(failed), "failed": failed[:3]}).decode() + "\n")


def run_sglang_peer(
    workdir: Path, prompts: list[list[int]], url: str, concurrency: int, max_new: int, stream: bool
) -> float:
    payload = workdir / "sglang-prompts.json"
    payload.write_bytes(orjson.dumps(prompts))
    # The counter before the child starts, taken as the watch's first sample at its first request: a --quick side
    # can be over between that request and the watch's own first read, which would leave the window empty.
    generated_before = _metric(url, "sglang:generation_tokens_total")
    child = subprocess.Popen(
        [PYTHON, str(Path(__file__).resolve()), "--sglang-child", str(payload), url, str(concurrency), str(max_new),
         "stream" if stream else "no-stream"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])},
    )  # fmt: skip
    # Its imports take a while on a busy machine: start watching at its first request, not at its start.
    watch: TokenWatch | None = None
    before = _tokens(url)
    while child.poll() is None and watch is None:
        if _tokens(url) != before or _running(url):
            watch = TokenWatch(url, first=(time.perf_counter(), generated_before))
        time.sleep(0.02)
    out, err = child.communicate()
    if child.returncode != 0 or watch is None:
        raise SystemExit(f"sglang bench_serving peer failed ({child.returncode}): {err.decode()[-3000:]}")
    result = orjson.loads(out.splitlines()[-1])
    if result["failed"] or result["ok"] != len(prompts):
        raise SystemExit(f"sglang bench_serving peer: {result}")
    return watch.steady_rate()


def _metric(url: str, name: str) -> float:
    import re
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _tokens(url: str) -> float:
    return _metric(url, "sglang:prompt_tokens_total")


def _running(url: str) -> bool:
    return _metric(url, "sglang:num_running_reqs") > 0


async def openai_peer(
    url: str, messages: list[list[dict[str, Any]]], template_kwargs: dict[str, Any], max_new: int, concurrency: int
) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    queue = iter(messages)
    answers = 0

    async def lane() -> None:
        nonlocal answers
        for conversation in queue:
            completion = await client.chat.completions.create(
                model="default", messages=conversation, max_tokens=max_new, temperature=0.6,  # type: ignore[arg-type]
                extra_body={"chat_template_kwargs": template_kwargs},
            )  # fmt: skip
            if completion.choices[0].message is not None:
                answers += 1

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    await client.close()
    return answers


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--sglang-child":
        sglang_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "stream")
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=600)
    parser.add_argument("--answer-tokens", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--with-stream", action="store_true", help="also bench_serving's default streaming mode")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, seconds: proves the benchmark runs (tests/test_bench_quick.py); figures not judged",
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.answer_tokens, args.concurrency, args.rounds = 48, 128, 16, 1

    from datagen_operator.api import parse_spec
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.prompts.render import template_variables
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    sim, url = start_sim(workdir, args.answer_tokens)
    max_new = args.answer_tokens * 2
    try:
        dataset = workdir / "prompts.jsonl"
        write_dataset(dataset, args.prompts)
        prompts = render_all(dataset, tokenizer_dir)
        messages = [orjson.loads(line)["messages"] for line in dataset.read_bytes().splitlines()]
        spec = _spec(dataset, tokenizer_dir, workdir / "unused", max_new, args.concurrency)
        template_kwargs = template_variables(resolve_model(parse_spec(spec)))
        print(f"{load_text()}; chat_template_kwargs {template_kwargs}", flush=True)
        ratios: dict[str, list[float]] = {"sglang": [], "sglang_stream": [], "openai": []}
        for round_index in range(args.rounds):
            output = workdir / f"out-{round_index}"
            watch = TokenWatch(url)
            run_worker(_spec(dataset, tokenizer_dir, output, max_new, args.concurrency), url, ["--no-compact"])
            worker = watch.steady_rate()
            shutil.rmtree(output)
            sglang = run_sglang_peer(workdir, prompts, url, args.concurrency, max_new, stream=False)
            streamed = (
                run_sglang_peer(workdir, prompts, url, args.concurrency, max_new, stream=True)
                if args.with_stream
                else 0
            )
            watch = TokenWatch(url)
            answered = asyncio.run(openai_peer(url, messages, template_kwargs, max_new, args.concurrency))
            openai = watch.steady_rate()
            if answered != len(messages):
                raise SystemExit(f"openai peer: {answered} of {len(messages)} answered")
            ratios["sglang"].append(worker / sglang)
            if streamed:
                ratios["sglang_stream"].append(worker / streamed)
            ratios["openai"].append(worker / openai)
            print(
                f"round {round_index}: worker {worker:,.0f} tok/s, sglang bench_serving {sglang:,.0f} tok/s"
                + (f" (streaming: {streamed:,.0f})" if streamed else "")
                + ", "
                f"openai client {openai:,.0f} tok/s (steady windows); {load_text()}",
                flush=True,
            )
        if ratios["sglang_stream"]:
            print(f"vs_sglang_bench_serving_streaming={statistics.median(ratios['sglang_stream']):.2f}")
        print(
            f"vs_sglang_bench_serving={statistics.median(ratios['sglang']):.2f} "
            f"vs_openai_client={statistics.median(ratios['openai']):.2f}"
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
