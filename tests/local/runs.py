"""`datagen run` as the local tests drive it: a run file on this machine, the CLI in a child process."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pyarrow.parquet as pq

from tests.harness.processes import wait_until
from tests.manifests import REPO, changed, local_spec, run_document, write_run

PROMPTS = REPO / "examples" / "prompts" / "quickstart.jsonl"
FAST_SIM = ["--sim-arg=--sim-mean-reasoning-tokens=48", "--sim-arg=--sim-mean-answer-tokens=32"]


def manifest(
    tmp_path: Path, standin_tokenizer: Path, *, dataset: Path = PROMPTS, output: Path | None = None, **changes: object
) -> Path:
    """`tmp_path/run.yaml`: two shards of four on one GPU, two canary prompts; `changes` are dotted spec paths
    (`DELETE` removes one)."""
    defaults = {"server.gpus": 1, "clients.shards": 2, "clients.concurrency": 4, "checks.canaryPrompts": 2}
    spec = changed(local_spec(standin_tokenizer, dataset, output or tmp_path / "out", **defaults), changes)
    document = run_document(spec)
    return write_run(tmp_path / "run.yaml", document)


def datagen_run(run_file: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "run", str(run_file), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


SLOW_SIM = ["--sim-arg=--sim-speed=gpu", "--sim-arg=--sim-tokens-per-s=40", "--sim-arg=--sim-ttft-s=0.05", *FAST_SIM]
"""A simulator slow enough that a run is still generating when the test acts on it, however loaded the machine (tens
of seconds for the quickstart's 24 prompts): a test interrupts such a run, or holds it (`held`) while it acts."""


def start_generating(
    run_file: Path, output: Path, timeout: float = 120, sim: list[str] = SLOW_SIM
) -> subprocess.Popen[str]:
    """`datagen run` on the slow simulator (`sim`) in a child process, returned once its workers write records."""
    process = subprocess.Popen(
        [sys.executable, "-m", "datagen_operator.cli", "run", str(run_file), *sim],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(
        lambda: list(output.glob("shards/*/*.jsonl")), timeout=timeout, describe="the run's workers writing",
        watched=[process],
    )  # fmt: skip
    return process


@contextlib.contextmanager
def held(process: subprocess.Popen[str]) -> Iterator[None]:
    """`process` and every process under it (server, workers) stopped by SIGSTOP until the block ends: a run held
    in progress, not raced. Its lease does not expire meanwhile (WORKER_LEASE_S is minutes) and its holder is alive."""
    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    for member in tree:
        member.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGCONT)


def dataset_ids() -> list[str]:
    return [orjson.loads(line)["id"] for line in PROMPTS.read_bytes().splitlines() if line.strip()]


def stored_keys(output: Path) -> list[tuple[str, int]]:
    keys = []
    for path in sorted((output / "data").glob("shard-*.parquet")):
        table = pq.read_table(path, columns=["id", "sample"])
        keys += list(zip(table.column("id").to_pylist(), table.column("sample").to_pylist(), strict=True))
    return keys
