"""A dataset edited on its volume while a run generates, on the real control plane: the workers notice within
seconds (worker/dataset_watch.py), stop sending, keep what they wrote, and the run halts `DatasetChanged` with
the worker's own words: the edited line, the fix. Before, the run said `WorkersFailed` with a message cut from
its front that ended in a JSON log line and "a rerun resumes" (issue 34, item 1)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from datagen_operator.output.layout import OutputLayout
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import OperatorFactory, Runs, new_name

PROMPTS = 400
SHARDS = 2
CONCURRENCY = 4
# About 0.3 s an answer: the run would take some 15 s more after the edit, far longer than noticing it may.
SIM = (
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "10",
    "--sim-mean-answer-tokens", "20", "--sim-speed", "gpu", "--sim-tokens-per-s", "100", "--sim-ttft-s", "0.02",
)  # fmt: skip


def written(output: Path) -> int:
    """Records written so far: whole lines of every shard's segments."""
    layout = OutputLayout(output)
    return sum(s.read_bytes().count(b"\n") for shard in range(SHARDS) for s in layout.segments(shard))


def test_a_dataset_edited_mid_run_halts_it_within_seconds_naming_the_line_and_the_fix(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    prompts = [
        {"id": f"q{i:04d}", "messages": [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]}
        for i in range(PROMPTS)
    ]
    dataset = data_dir / "prompts.jsonl"
    dataset.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    name = new_name("edited")
    output = data_dir / "out" / name
    manifest = cluster_run(
        name, data_dir, standin_tokenizer, **{"clients.shards": SHARDS, "clients.concurrency": CONCURRENCY}
    )
    with start_sim(*SIM, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(manifest)
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        runs.wait_for("40 records on the volume", lambda: written(output) >= 40, 120)
        # An atomic rename over the dataset, as an editor or `sed -i` does: line 2 edited.
        edited = [dict(p) for p in prompts]
        edited[1] = {**prompts[1], "messages": [{"role": "user", "content": "Question 1, edited"}]}
        fresh = data_dir / "fresh.jsonl"
        fresh.write_text("".join(json.dumps(p) + "\n" for p in edited))
        os.replace(fresh, dataset)
        at_edit, edited_at = written(output), time.monotonic()
        runs.wait_for(
            "the workers stopped",
            lambda: (
                runs.job(f"{name}-workers") is not None
                and not kubelet.running(runs.namespace, f"{name}-workers-")
                and (runs.job(f"{name}-workers").status.failed or 0) > 0
            ),
            60,
        )
        stopped_after = time.monotonic() - edited_at
        halted = runs.wait(name, "Succeeded", "False", "DatasetChanged", timeout=60)
        after_edit = written(output) - at_edit

    # Noticed within seconds: what was in flight then (CONCURRENCY per shard) and what the watch's 1 s tick
    # let through, far from the ~300 the run had left.
    assert after_edit <= 4 * SHARDS * CONCURRENCY, (after_edit, stopped_after)
    message = halted["message"]
    assert message.startswith("spec.dataset.path ") and "prompts.jsonl changed since this output was started" in message
    assert "1 line edited (line 2 (id 'q0001'))" in message and "restore the file it was started with" in message, (
        message
    )
    assert "{" not in message and "rerun resumes" not in message, message
    assert runs.condition(name, "Progressing")["reason"] == "DatasetChanged"
    # Exit 2 is a verdict: no shard is retried into the changed file.
    created = [pod for ns, pod, _ in kubelet.history if ns == runs.namespace and pod.startswith(f"{name}-workers-")]
    assert len(created) == SHARDS, created

    # The run's Warning is the halt's, in the same words: no WorkersFailed, no retry, nothing else.
    def warnings() -> list[tuple[str, str]]:
        return [(e.reason, e.message) for e in runs.events(name) if e.type == "Warning"]

    runs.wait_for("the halt's event", lambda: any(r == "SucceededDatasetChanged" for r, _ in warnings()), 30)
    runs.wait_for(
        "Progressing's event", lambda: any(e.reason == "ProgressingDatasetChanged" for e in runs.events(name))
    )
    # One Warning for one halt (Progressing=False says the same, as a Normal event).
    ((reason, message),) = warnings()
    assert reason == "SucceededDatasetChanged" and "line 2 (id 'q0001')" in message, warnings()
    assert runs.condition(name, "ServerReady")["reason"] == "Released"
