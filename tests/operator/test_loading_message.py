"""While SGLang loads the weights (minutes to an hour), ServerReady's Loading message says how long so far:
the operator writes a change that only moves that number at least every progress_write_s, so
`kubectl get dgr -o wide` and `describe` never show the first second for the whole load."""

from __future__ import annotations

import re
import time
from pathlib import Path

from datagen_operator.k8s.settings import Settings
from tests.harness.kubelet import PodRunner
from tests.harness.processes import free_port
from tests.harness.sim import SimServer
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name

PROGRESS_WRITE_S = 2.0
"""The operator fixture's DATAGEN_PROGRESS_WRITE_SECONDS (tests/operator/conftest.py)."""
LOADING = re.compile(r"loading the model: (\d+)s of ")


def test_progress_only_writes_are_due_within_a_minute_by_default() -> None:
    assert Settings().progress_write_s <= 60


def test_the_loading_message_moves_while_the_server_loads(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("loading")
    # A simulator on a port chosen now and never started here: the server pod runs, /health_generate does not
    # answer, so the server reads as loading for as long as the test watches.
    sim = SimServer((*KIMI, *SLOW), tokenizer_dir=standin_tokenizer, port=free_port())
    try:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "ServerReady", "False", "Loading", timeout=120)
        seconds: list[int] = []
        deadline = time.monotonic() + 4 * PROGRESS_WRITE_S
        while time.monotonic() < deadline:
            ready = next(c for c in runs.get(name)["status"]["conditions"] if c["type"] == "ServerReady")
            assert ready["reason"] == "Loading", ready
            match = LOADING.search(ready["message"])
            assert match, ready["message"]
            seconds.append(int(match.group(1)))
            time.sleep(0.25)
        distinct = sorted(set(seconds))
        assert seconds == sorted(seconds), seconds
        assert len(distinct) >= 3 and distinct[-1] - distinct[0] >= 2 * PROGRESS_WRITE_S, distinct
    finally:
        sim.stop()
