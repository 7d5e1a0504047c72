"""`datagen run` again over an output: a finished one is recognised before any server starts (on GPUs, no model
load for nothing), verified from its files and reported; nothing is generated twice."""

from __future__ import annotations

from pathlib import Path

from tests.local.runs import FAST_SIM, datagen_run, manifest, stored_keys


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_finished_output_is_verified_without_a_server(tmp_path: Path, standin: Path) -> None:
    run_file = manifest(tmp_path, standin)
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
