"""Records the server finished but the output lost to a kill are generated again: at most those in flight."""

from __future__ import annotations

import re
import signal
import urllib.request
from pathlib import Path

import pytest

from tests.harness.processes import wait_until
from tests.harness.sim import start_sim
from tests.worker.simrun import SIM_FLAGS, prompts, raw_segment_keys, spawn, spec, standin, write_dataset

CONCURRENCY = 16


def _metric(url: str, name: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.MULTILINE)
    return int(float(match.group(1))) if match else 0


def _finished(url: str) -> int:
    """Answers the simulator completed (its `sglang:num_requests_total`)."""
    return _metric(url, "sglang:num_requests_total")


def _busy(url: str) -> int:
    """Requests the simulator still runs or queues (`sglang:num_running_reqs` + `sglang:num_queue_reqs`)."""
    return _metric(url, "sglang:num_running_reqs") + _metric(url, "sglang:num_queue_reqs")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_kill_at_wire_speed_loses_no_more_than_the_requests_in_flight(tmp_path: Path, sig: signal.Signals) -> None:
    items = prompts(4000, tools_every=0)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.concurrency": CONCURRENCY})
    log = tmp_path / "worker.log"
    # Wire speed: hundreds of answers a second, so anything held back in memory is many records.
    with start_sim(*SIM_FLAGS, "--sim-speed", "wire", "--enable-metrics", tokenizer_dir=standin()) as server:
        worker = spawn(document, [server.url], "--render-processes", "0", "--no-compact", log=log)
        try:
            wait_until(
                lambda: _finished(server.url) >= 300, timeout=120, describe="300 answers before the signal",
                watched=[worker], interval=0.02, details=lambda: log.read_text()[-3000:],
            )  # fmt: skip
            worker.send_signal(sig)
            worker.wait(60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        # Answers the server was still producing for the dead worker finish there: counted once none is left.
        wait_until(
            lambda: not _busy(server.url), timeout=30, describe="the server done with the dead worker's requests",
            interval=0.05,
        )  # fmt: skip
        finished, kept = _finished(server.url), len(raw_segment_keys(output))
    assert finished < len(items), "the run finished before the kill"
    wasted = finished - kept
    assert 0 <= wasted <= (CONCURRENCY if sig == signal.SIGKILL else 0), (finished, kept, log.read_text()[-2000:])
