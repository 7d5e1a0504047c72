"""Records the server finished but the output lost to a kill are generated again: at most those in flight."""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

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
            deadline = time.monotonic() + 120
            while _finished(server.url) < 300:
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the worker generated too little"
                time.sleep(0.02)
            worker.send_signal(sig)
            worker.wait(60)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        # Answers the server was still producing for the dead worker finish there: counted once none is left.
        deadline = time.monotonic() + 30
        while _busy(server.url):
            assert time.monotonic() < deadline, "the server still runs the dead worker's requests after 30 s"
            time.sleep(0.05)
        finished, kept = _finished(server.url), len(raw_segment_keys(output))
    assert finished < len(items), "the run finished before the kill"
    wasted = finished - kept
    assert 0 <= wasted <= (CONCURRENCY if sig == signal.SIGKILL else 0), (finished, kept, log.read_text()[-2000:])
