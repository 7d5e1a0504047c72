"""With the operator's default spacing of progress-only status writes, `status.progress` follows the workers' own
counts (their shard ConfigMaps) at most about 10 s behind while a run generates: before, the operator wrote
numbers-only changes every 30 s and a run's PROGRESS column stood still that long (issue 34 item 6)."""

from __future__ import annotations

import time
from pathlib import Path

from datagen_operator.api.progress import ShardProgress
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import OperatorFactory, Runs, many_prompts, new_name

PROMPTS = 240
# About 1 s an answer, 4 in flight a shard: some 30 s of generation, several spacings of either default.
SIM = (
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "10",
    "--sim-mean-answer-tokens", "30", "--sim-speed", "gpu", "--sim-tokens-per-s", "40", "--sim-ttft-s", "0.05",
)  # fmt: skip
LAG_BOUND_S = 10.0 + 2.0
"""10 s (the workers' 5 s ConfigMap spacing is not counted here: the ConfigMap is the workers' own), plus the
sampling's and a pass's slack."""


def test_status_progress_follows_the_workers_within_about_10_s(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    many_prompts(data_dir, PROMPTS, "why is the sky blue?")
    name = new_name("lag")
    manifest = cluster_run(name, data_dir, standin_tokenizer, **{"clients.shards": 2, "clients.concurrency": 4})
    samples: list[tuple[float, int, int]] = []  # (time, the workers' records, status.progress.records)

    def workers_records() -> int:
        listed = runs.core.list_namespaced_config_map(runs.namespace, label_selector=f"datagen.dev/run={name}")
        total = 0
        for cm in listed.items:
            text = (cm.data or {}).get("progress.json")
            if text:
                total += ShardProgress.from_storage(text).records_done
        return total

    with start_sim(*SIM, tokenizer_dir=standin_tokenizer) as sim:
        operator(
            [sim.url], env={"DATAGEN_PROGRESS_WRITE_SECONDS": None, "DATAGEN_MESSAGE_WRITE_SECONDS": None}
        )  # the operator's own default
        runs.create(manifest)
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = runs.get(name).get("status") or {}
            shown = (status.get("progress") or {}).get("records", 0)
            samples.append((time.monotonic(), workers_records(), shown))
            if shown >= PROMPTS:
                break
            time.sleep(0.5)
        runs.wait(name, "Succeeded", "True", "Completed", timeout=120)

    generating = [s for s in samples if 0 < s[1] < PROMPTS]
    assert len(generating) >= 40, f"the run generated for {len(generating) / 2:.0f} s: too short to measure"
    # For each moment the workers were ahead, how long until the status showed at least their count then.
    lags = []
    for at, theirs, shown in generating:
        if shown >= theirs:
            continue
        caught_up = next((t for t, _, s in samples if t > at and s >= theirs), None)
        assert caught_up is not None, f"status never reached the workers' {theirs} records"
        lags.append(caught_up - at)
    assert lags, "the status is written after the workers' counts, so it trails them at some point"
    worst = max(lags)
    with (runs.cluster.logs_dir / "progress-lag.log").open("a") as log:  # stdout belongs to KopfRunner here
        log.write(f"{name}: {len(generating)} samples while generating, worst lag {worst:.1f} s\n")
    assert worst <= LAG_BOUND_S, f"status.progress trailed the workers by {worst:.1f} s"
