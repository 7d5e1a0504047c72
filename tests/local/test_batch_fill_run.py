"""`datagen run` says at the canary when shards x clients.concurrency cannot keep the server's batch full
(its `max_running_requests` from /server_info), by how much and what to set; the canary still passes."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.local.runs import FAST_SIM, datagen_run, manifest

WARNING = (
    "warning: 8 requests in flight for 1 server that run 64 each: at most 12% of their batch slots used; "
    "set clients.concurrency: 36 (with clients.shards: 2)"
)


def test_a_run_that_cannot_fill_the_servers_batch_is_told_at_the_canary(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    # Two shards of four requests against a server that runs 64 at once (SGLang's --max-running-requests).
    result = datagen_run(manifest(tmp_path, standin_tokenizer), *FAST_SIM, "--sim-arg=--max-running-requests=64")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "CanaryPassed=True" in line]
    assert "(Passed)" in line and line.endswith(WARNING), line
    verdict = orjson.loads((tmp_path / "out" / "canary.verdict.json").read_bytes())["outcome"]
    (check,) = [c for c in verdict["checks"] if c["name"] == "batch_full"]
    assert (check["count"], check["total"], check["passed"]) == (8, 64, True)
    assert "Succeeded=True" in result.stdout


def test_concurrency_auto_sends_at_the_number_that_fills_the_servers_batch(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    # Two shards, clients.concurrency auto, a server that runs 64 at once: 64 slots x 1.1 over 2 shards is 36 each.
    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": "auto"})
    result = datagen_run(run_file, *FAST_SIM, "--sim-arg=--max-running-requests=64")
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "CanaryPassed=True" in line]
    assert line.endswith("; clients.concurrency auto: 36 per shard x 2 shards for 1 server of 64 slots"), line
    assert "warning" not in line, "auto fills the batch: nothing to warn of"
    verdict = orjson.loads((tmp_path / "out" / "canary.verdict.json").read_bytes())["outcome"]
    assert verdict["concurrency"] == 36, "recorded in the canary's verdict, for a resume"
    (check,) = [c for c in verdict["checks"] if c["name"] == "batch_full"]
    assert (check["count"], check["total"], check["passed"]) == (72, 64, True)
    for shard in (0, 1):
        log = (tmp_path / "out" / "logs" / f"worker-{shard}.log").read_text()
        started = [orjson.loads(entry) for entry in log.splitlines() if "already recorded" in entry]
        assert started and {entry["concurrency"] for entry in started} == {36}, log[-2000:]
    assert "Succeeded=True" in result.stdout
