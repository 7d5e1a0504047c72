"""Benchmark: `datagen preflight` on a large dataset (render once, on every core), and the worker's first request
after it.

    .venv/bin/python bench/preflight.py [--prompts 1000000] [--quick]

The dataset is bench/scale.py's (short chat prompts, 1,000 distinct questions, each id its own line), the Kimi-K2.5
stand-in tokenizer. Measured in this one run:
- preflight_s, preflight_rss_mb: `datagen preflight` of a new output, wall time and the peak resident memory of its
  process tree (its render helpers included: sampled every 50 ms, and its own ru_maxrss);
- worker_start_s: from spawning `datagen worker` on that output to the simulator's first request, with the
  preflight's rendered prompts (`rendered/`), and the same with them removed (the worker renders), side by side.
The machine is shared: the load average is printed at the start and end. Last line:

    preflight_s=<s> (goal <= 60) preflight_rss_mb=<MB> (goal <= 400) worker_start_s=<s> (without rendered: <s>)
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for its sibling bench.scale
from bench.scale import (
    PYTHON,
    REPO,
    Sampler,
    load,
    measured,
    measured_rss_mb,
    run_file,
    start_sim,
    start_worker,
    write_dataset,
)


def preflight(run: Path) -> tuple[float, float, str]:
    cmd = [PYTHON, "-m", "datagen_operator.cli", "preflight", "--run", str(run)]
    started = time.monotonic()
    rss_file = run.with_name("preflight.maxrss")
    proc = subprocess.Popen(measured(cmd, rss_file), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sampler = Sampler(proc.pid, include_root=False)
    out, err = proc.communicate(timeout=3600)
    elapsed = time.monotonic() - started
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"preflight exited {proc.returncode}: {err.decode()[-2000:]}")
    return elapsed, max(sampler.peak, measured_rss_mb(rss_file)), out.decode().strip().splitlines()[-1][:200]


def first_request(run: Path, output: Path, url: str, log: Path) -> float:
    proc, seconds = start_worker(run, output, url, log)
    proc.kill()
    proc.wait(60)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="2,000 prompts: seconds, figures not judged")
    args = parser.parse_args()
    prompts = 2000 if args.quick else args.prompts

    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    print(load(), flush=True)
    tokenizer_dir = ensure_standin_tokenizer()
    workdir = Path(tempfile.mkdtemp(prefix="bench-preflight-"))
    sim, url = start_sim(workdir)
    try:
        dataset = workdir / "prompts.jsonl"
        write_dataset(dataset, prompts)
        output = workdir / "out"
        run = run_file(workdir, dataset, output, tokenizer_dir, 64)
        seconds, rss, said = preflight(run)
        print(f"preflight of {prompts} prompts: {seconds:.1f}s, peak RSS {rss:.0f} MB (tree); {said}", flush=True)
        log = workdir / "worker.log"
        with_store = first_request(run, output, url, log)
        shutil.rmtree(output / "rendered")
        for segment in output.glob("shards"):
            shutil.rmtree(segment)
        without = first_request(run, output, url, log)
        print(load(), flush=True)
        print(f"preflight_s={seconds:.1f} (goal <= 60) preflight_rss_mb={rss:.0f} (goal <= 400) "
              f"worker_start_s={with_store:.2f} (without rendered: {without:.2f})")  # fmt: skip
    finally:
        os.killpg(sim.pid, 9)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
