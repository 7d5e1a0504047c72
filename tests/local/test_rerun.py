"""`datagen run` again over an output: a finished one is recognised before any server starts (on GPUs, no model
load for nothing), verified from its files and reported; nothing is generated twice."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.harness.processes import wait_until
from tests.local.runs import FAST_SIM, datagen_run, manifest, start_generating, stored_keys


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_finished_output_is_verified_without_a_server(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(tmp_path, standin_tokenizer)
    first = datagen_run(run_file, *FAST_SIM)
    assert first.returncode == 0, first.stdout + first.stderr
    keys = stored_keys(tmp_path / "out")
    server_log = tmp_path / "out" / "logs" / "server-0.log"
    server_log.unlink()

    again = datagen_run(run_file, *FAST_SIM)
    said = flat(again.stdout)
    assert again.returncode == 0, said
    assert "already holds every record" in said and "no server needed" in said
    assert "ServerReady=False (NotNeeded)" in said
    assert "started 1 server replica" not in said and not server_log.exists(), "no server may be started"
    assert "CanaryPassed" not in said.split("InputsVerified=True")[-1], "no canary either"
    assert f"Succeeded=True (Completed): {len(keys)}/{len(keys)} prompts" in said
    assert stored_keys(tmp_path / "out") == keys, "nothing generated twice"


def test_a_resume_whose_canary_passed_with_the_same_fingerprint_does_not_rerun_it(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    import signal

    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": 2})
    out = tmp_path / "out"
    first = start_generating(run_file, out)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=90)
    assert first.returncode == 130
    canary_records = (out / "canary.jsonl").read_bytes()

    again = datagen_run(run_file, *FAST_SIM)
    said = flat(again.stdout)
    assert again.returncode == 0, said
    assert "canary: passed before on this output with the same fingerprint; not rerun" in said
    assert "CanaryPassed=True (Passed): passed before with the same fingerprint (not rerun)" in said
    assert (out / "canary.jsonl").read_bytes() == canary_records, "no canary request was sent again"

    # Held to its key only: another fingerprint (other checks, tokenizer, template or data fields) is not answered.
    from datagen_operator.output.canary_verdict import remembered_canary
    from datagen_operator.output.layout import OutputLayout

    stored = orjson.loads(OutputLayout(out).canary_verdict.read_bytes())
    assert remembered_canary(out, stored["key"]) is not None
    assert remembered_canary(out, "0" * 64) is None


def test_the_canary_key_moves_with_the_checks_and_data_fields_not_with_live_ones(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    from datagen_operator.api import load_run
    from datagen_operator.local.runner import LocalRunner

    def key(**changes: object) -> str:
        run = load_run(manifest(tmp_path, standin_tokenizer, **changes))
        return LocalRunner(run, tmp_path / "out", simulator=True)._canary_key()

    base = key()
    assert key(**{"clients.concurrency": 7}) == base  # how the run is carried out
    assert key(**{"checks.minReasoningRate": 0.99}) != base  # what the canary is judged by
    assert key(**{"generation.sampling.temperature": 0.9}) != base  # what the records hold


def test_a_resumes_progress_starts_at_the_records_the_output_holds(tmp_path: Path, standin_tokenizer: Path) -> None:
    """The workers' snapshots of the first attempt are gone (a worker killed before its first publish, a
    cluster's recreated ConfigMaps): the rerun's progress counts the records on disk from its first line."""
    import re
    import signal

    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": 2})
    out = tmp_path / "out"
    first = start_generating(run_file, out)
    wait_until(
        lambda: any(path.read_bytes().count(b"\n") for path in out.glob("shards/*/segment-*.jsonl")), timeout=60,
        describe="a record", watched=[first], interval=0.1,
    )  # fmt: skip
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=90)
    held = len(stored_keys(out)) or sum(path.read_bytes().count(b"\n") for path in out.glob("shards/*/segment-*.jsonl"))
    assert held > 0
    for snapshot in out.glob("shards/*/progress.json"):
        snapshot.unlink()

    again = datagen_run(run_file, *FAST_SIM)
    said = flat(again.stdout)
    assert again.returncode == 0, said
    running = re.findall(r"Progressing=True \(Running\): (\d+)/(\d+) prompts", said)
    assert running, said
    assert all(int(done) >= held for done, _ in running), (held, running)
