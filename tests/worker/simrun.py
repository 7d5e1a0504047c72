"""Helpers for worker tests against the simulator: datasets, specs, running the worker, checking output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records
from tests.harness.processes import wait_until
from tests.kimi_reference import TOOLS
from tests.manifests import local_spec

REPO = Path(__file__).resolve().parents[2]
# Short answers: tests are about bookkeeping, not volume.
SIM_FLAGS = (
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
    "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3",
)  # fmt: skip


@cache
def standin() -> Path:
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    return ensure_standin_tokenizer()


def prompts(count: int, *, tools_every: int = 5) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        prompt: dict[str, Any] = {"id": f"p{i:04d}", "messages": [{"role": "user", "content": f"Question {i}?"}]}
        if i % 3 == 0:
            prompt["messages"].insert(0, {"role": "system", "content": "Be brief."})
        if tools_every and i % tools_every == 0:
            prompt["tools"] = TOOLS
        out.append(prompt)
    return out


def write_dataset(path: Path, items: list[dict[str, Any]], extra_lines: dict[int, bytes] | None = None) -> Path:
    """JSONL; `extra_lines` inserts raw lines before the given prompt index."""
    extra_lines = extra_lines or {}
    with path.open("wb") as file:
        for index, item in enumerate(items):
            if index in extra_lines:
                file.write(extra_lines[index] + b"\n")
            file.write(orjson.dumps(item) + b"\n")
    return path


def spec(dataset: Path, output: Path, **changes: Any) -> dict[str, Any]:
    """A kimi-k2.5 run (the preset's thinking default) with the stand-in tokenizer; `changes` are dotted paths."""
    base = {
        "generation": {"sampling": {"max_new_tokens": 512, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": 8, "maxAttempts": 8, "requestTimeout": "30s"},
    }
    return local_spec(standin(), dataset, output, **{**base, **changes})


def worker_args(document: dict[str, Any], servers: list[str], *extra: str) -> list[str]:
    args = ["--spec-json", json.dumps(document), "--output", document["output"]["path"]]
    for url in servers:
        args += ["--server", url]
    return [*args, "--log-format", "json", "--backoff-base", "0.01", "--backoff-cap", "0.05", *extra]


def run_inprocess(document: dict[str, Any], servers: list[str], *extra: str) -> int:
    from datagen_operator.worker.main import main

    return main(worker_args(document, servers, "--render-processes", "0", *extra))


def spawn(document: dict[str, Any], servers: list[str], *extra: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "datagen_operator.cli", "worker", *worker_args(document, servers, *extra)],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip


@cache
def reference_renderer(thinking: bool = True) -> Any:
    from datagen_operator.prompts.render import Renderer, load_tokenizer

    return Renderer(load_tokenizer(standin(), trust_remote_code=False), {"thinking": thinking})


def raw_segment_keys(output: Path, shard: int = 0) -> Counter[tuple[str, int, int]]:
    """Every record line in the shard's segments, counted by key (duplicates would show as 2)."""
    counts: Counter[tuple[str, int, int]] = Counter()
    for segment in OutputLayout(output).segments(shard):
        for line in segment.read_bytes().splitlines():
            record = orjson.loads(line)
            counts[(record["id"], record["sample"], record.get("turn", 0))] += 1
    return counts


def check_records(
    output: Path,
    items: list[dict[str, Any]],
    *,
    samples: int = 1,
    allowed_flags: frozenset[str] = frozenset(),
    servers: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Every (prompt, sample) exactly once, and every record faithful: the prompt as the template renders
    it, output ids consistent with completion_tokens, a proper stop, no unexpected flags."""
    renderer = reference_renderer()
    expected_inputs = {item["id"]: renderer.reference(item["messages"], item.get("tools")) for item in items}
    records = list(iter_records(output))
    keys = Counter((r["id"], r["sample"]) for r in records)
    assert not [k for k, n in keys.items() if n > 1], "duplicates"
    wanted = {(item["id"], s) for item in items for s in range(samples)}
    assert set(keys) == wanted, f"missing {sorted(wanted - set(keys))[:5]}, extra {sorted(set(keys) - wanted)[:5]}"
    for record in records:
        assert record["input_ids"] == expected_inputs[record["id"]]
        assert record["input_ids"][-1] == 163606  # thinking on: the prompt ends with <think>
        assert len(record["output_ids"]) == record["completion_tokens"] > 0
        assert record["prompt_tokens"] == len(record["input_ids"])
        assert record["finish_reason"]["type"] == "stop" and record["output_ids"][-1] == 163586
        assert 163607 in record["output_ids"]  # </think>
        assert set(record["flags"]) <= allowed_flags, record["flags"]
        assert record["attempts"] >= 1 and record["latency_s"] > 0
        assert servers is None or record["server"] in servers
        has_tools = bool(next(item for item in items if item["id"] == record["id"]).get("tools"))
        assert record["has_tools"] is has_tools
    return records


def progress(output: Path, shard: int = 0) -> dict[str, Any]:
    return orjson.loads(OutputLayout(output).progress(shard).read_bytes())


def kill_9_after_records(document: dict[str, Any], server: str, log: Path, at_least: int = 1) -> int:
    """Spawns the worker (no compaction, rendering inline), kills it with SIGKILL once its segments hold
    `at_least` records, and returns how many they held then (fails the test if it finished or wrote none first)."""
    import signal

    output = Path(document["output"]["path"])
    worker = spawn(document, [server], "--no-compact", "--render-processes", "0", log=log)

    def written() -> int:
        return sum(raw_segment_keys(output).values()) if OutputLayout(output).shard_dir(0).is_dir() else 0

    try:
        wait_until(
            lambda: written() >= at_least, timeout=90, describe=f"{at_least} records before the kill",
            watched=[worker], interval=0.01, details=lambda: log.read_text()[-3000:],
        )  # fmt: skip
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        return written()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
