"""How soon after the server is ready does the canary give its verdict, and does a failed canary keep
every bulk record out?

The SGLang simulator runs at GPU-like speed (60 tokens/s per request, 2 s to first token, seeds-like
lengths: ~800 reasoning + ~400 answer tokens) with the default canary (8 dataset prompts + 3 probes).
Part 1 times the gate the runners use (parser check and canary side by side) from the moment
/health_generate first answers. Part 2 runs a whole `datagen run` whose server leaks prompt-suffix tokens
(the upstream bug) and counts the bulk records written. Last line:
`canary_seconds=<s> (goal < 60) bulk_records_after_failed_canary=<n> (goal 0)`. `--quick`: the simulator at wire
speed (seconds, for tests/test_bench_quick.py): the figures are printed, not judged.
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py (the operator benchmark)
# would shadow the standard library's `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from datagen_operator.api import load_run
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.engine.client.reads import is_healthy
from datagen_operator.engine.launch import server_argv
from datagen_operator.local.processes import Child, free_port
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.canary import run_canary
from datagen_operator.steps.parser_check import verify_running_server
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

REPO = Path(__file__).resolve().parents[1]
GPU_LIKE = ["--sim-speed", "gpu", "--sim-tokens-per-s", "60", "--sim-ttft-s", "2"]
WIRE = ["--sim-speed", "wire"]


def write_manifest(folder: Path, standin: Path) -> Path:
    document = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "DataGenRun",
        "metadata": {"name": "bench-canary"},
        "spec": {
            "model": {"preset": "kimi-k2.5", "path": str(standin)},
            "server": {"gpus": 8},
            "dataset": {"path": str(REPO / "examples" / "prompts" / "quickstart.jsonl")},
            "generation": {"thinking": True, "sampling": {"max_new_tokens": 16384, "temperature": 0.6}},
            "clients": {"shards": 2},
            "output": {"path": str(folder / "out")},
        },
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def time_gate(run_file: Path, pace: list[str]) -> float:
    spec = load_run(run_file).spec
    tokenizer = load_tokenizer(spec.model.path, trust_remote_code=True)
    port = free_port()
    argv = server_argv(spec, host="127.0.0.1", port=port, python=sys.executable)
    sim = Child(
        "sim",
        [sys.executable, "-m", "datagen_operator.cli", "sim-server", *argv[3:], *pace],
        run_file.parent / "sim.log",
    )
    await sim.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            while not await is_healthy(session, url):  # noqa: ASYNC110 (polling a server, not a flag)
                await asyncio.sleep(0.05)
            ready = time.monotonic()
            parsers, canary = await asyncio.gather(
                verify_running_server(session, url, spec),
                run_canary(spec, tokenizer, Path(spec.dataset.path), [url]),
            )
            seconds = time.monotonic() - ready
        print(f"parsers: {parsers.reason}: {parsers.message}")
        print(f"canary ({spec.checks.canary_prompts} prompts + probes): {canary.reason}: {canary.message}")
        if not (parsers.passed and canary.passed):
            raise SystemExit("the gate should pass on a correctly configured simulator")
        return seconds
    finally:
        await sim.stop(5)


def bulk_records_after_failed_canary(run_file: Path, pace: list[str]) -> int:
    out = run_file.parent / "out"
    sim_args = [f"--sim-arg={flag}" for flag in pace] + ["--sim-arg=--sim-prompt-suffix-leak=3"]
    result = subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "run", str(run_file), *sim_args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    halted = "Succeeded=False (CanaryFailed)" in result.stdout
    print(f"failed-canary run: exit {result.returncode}, halted by the canary: {halted}")
    if not halted:
        print(result.stdout[-3000:], result.stderr[-2000:])
    return sum(len(p.read_bytes().splitlines()) for p in out.glob("shards/*/*.jsonl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the simulator at wire speed: seconds; figures not judged")
    args = parser.parse_args()
    pace = WIRE if args.quick else GPU_LIKE
    standin = ensure_standin_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        run_file = write_manifest(Path(tmp), standin)
        seconds = asyncio.run(time_gate(run_file, pace))
        print(f"server ready -> canary verdict: {seconds:.1f} s (goal < 60 s)")
        bulk = bulk_records_after_failed_canary(run_file, pace)
    print(f"canary_seconds={seconds:.1f} (goal < 60) bulk_records_after_failed_canary={bulk} (goal 0)")


if __name__ == "__main__":
    main()
