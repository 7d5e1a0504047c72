"""`datagen run` end to end on the simulator: success, halts before bulk work, Ctrl-C and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson

from datagen_operator.api.commands import VerifyCommand
from tests.local.runs import FAST_SIM, datagen_run, dataset_ids, manifest, start_generating, stored_keys
from tests.manifests import DELETE
from tests.programs import run_program


def test_quickstart_like_run_succeeds_and_verifies(tmp_path: Path, standin_tokenizer: Path) -> None:
    result = datagen_run(manifest(tmp_path, standin_tokenizer), *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "out"
    assert "SGLang simulator" in result.stdout
    for condition in ("ServerReady=True", "ParsersVerified=True", "CanaryPassed=True", "Succeeded=True"):
        assert condition in result.stdout, result.stdout
    assert sorted(stored_keys(out)) == sorted((i, 0) for i in dataset_ids())
    verify = run_program(VerifyCommand(output=str(out), json=True))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = orjson.loads(verify.stdout)
    assert report["passed"] and report["records"] == len(dataset_ids())


def test_wrong_reasoning_parser_halts_before_bulk_work(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(
        tmp_path,
        standin_tokenizer,
        **{"model.preset": DELETE, "server.reasoningParser": "kimi", "server.toolCallParser": "kimi_k2"},
    )
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ParsersVerified=False" in result.stdout
    assert "use kimi_k2" in result.stdout
    assert "Succeeded=False (ParsersMismatch)" in result.stdout
    assert not list((tmp_path / "out").glob("shards/*/*.jsonl")), "no bulk record may be written"
    # The canary starts only after the parsers pass (control.decide): not one canary prompt was sent.
    assert "CanaryPassed=Unknown (NotRun)" in result.stdout
    assert not (tmp_path / "out" / "canary.jsonl").exists()


def test_a_server_whose_parsers_cannot_be_read_halts_after_bounded_probes(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS

    # Every generation request fails with a 500, the chat probe included; /health and /server_info answer.
    result = datagen_run(manifest(tmp_path, standin_tokenizer), *FAST_SIM, "--sim-arg=--sim-fault-5xx-rate=1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ParsersVerified=False (ProbeFailed)" in result.stdout
    assert f"in {PARSER_PROBE_ATTEMPTS} attempts" in result.stdout
    assert "Succeeded=False (ProbeFailed)" in result.stdout
    assert not (tmp_path / "out" / "canary.jsonl").exists(), "no canary prompt after a failed probe"


def test_model_that_ignores_thinking_is_named_by_the_canary(tmp_path: Path, standin_tokenizer: Path) -> None:
    """The parsers are right (ParsersVerified=True); the canary names the model as the cause. Every answer its mean
    length: such a model writes the same answer with the think block open or closed, where the simulator draws each
    request's length anew (the median ratio of 5 sampled pairs crossed the rule's 1.8 in 1 run of 6)."""
    misconfigured = ("--sim-arg=--sim-misconfig=ignore-thinking", "--sim-arg=--sim-length-sigma=0")
    result = datagen_run(manifest(tmp_path, standin_tokenizer), *FAST_SIM, *misconfigured)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ParsersVerified=True" in result.stdout
    assert "CanaryPassed=False" in result.stdout
    assert "kimi-k2.5 ignores thinking" in result.stdout
    assert "Succeeded=False (CanaryFailed)" in result.stdout
    assert not list((tmp_path / "out").glob("shards/*/*.jsonl"))


def test_empty_dataset_is_refused_before_any_server(tmp_path: Path, standin_tokenizer: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    run_file = manifest(tmp_path, standin_tokenizer, dataset=tmp_path / "empty.jsonl")
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "InputsVerified=False" in result.stdout
    assert "Succeeded=False (PreflightFailed)" in result.stdout
    assert "the dataset is empty" in result.stdout
    assert not (tmp_path / "out" / "logs" / "server-0.log").exists(), "no server may be started"


def test_a_server_over_several_nodes_is_refused_pointing_to_the_operator(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    run_file = manifest(
        tmp_path, standin_tokenizer, **{"server.nodes": 2, "server.gpus": 1, "server.tensorParallel": 2}
    )
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 2, result.stdout + result.stderr
    output = " ".join(result.stdout.split())  # rich wraps long lines
    assert "server.nodes is 2: a server over several nodes runs in Kubernetes only" in output
    assert "LeaderWorkerSet group the operator creates" in output
    assert not (tmp_path / "out" / "logs").exists(), "nothing may be started"


def test_prompt_suffix_leak_fails_the_canary(tmp_path: Path, standin_tokenizer: Path) -> None:
    result = datagen_run(manifest(tmp_path, standin_tokenizer), *FAST_SIM, "--sim-arg=--sim-prompt-suffix-leak=3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ParsersVerified=True" in result.stdout
    assert "CanaryPassed=False" in result.stdout
    assert "prompt-suffix tokens" in result.stdout
    assert "Succeeded=False (CanaryFailed)" in result.stdout
    assert not list((tmp_path / "out").glob("shards/*/*.jsonl")), "no bulk record may be written"
    assert (tmp_path / "out" / "canary.jsonl").exists()


def _children_of(output: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(output)], capture_output=True, text=True)
    return [pid for pid in found.stdout.split() if int(pid) != os.getpid()]


def test_ctrl_c_stops_everything_and_a_rerun_resumes(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.concurrency": 2})
    out = tmp_path / "out"
    process = start_generating(run_file, out)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=90)
    assert process.returncode == 130, stdout
    assert "rerun" in stdout
    assert _children_of(out) == [], "server or worker processes left behind"

    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    keys = stored_keys(out)
    assert len(keys) == len(set(keys)), "duplicates after resume"
    assert sorted(keys) == sorted((i, 0) for i in dataset_ids()), "records lost after resume"

    # The same output with other sampling is refused before a server is started (on GPUs: before a model load).
    changed = manifest(
        tmp_path, standin_tokenizer, **{"clients.concurrency": 2, "generation.sampling.temperature": 0.9}
    )
    refused = datagen_run(changed, *FAST_SIM)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "InputsVerified=False" in refused.stdout and "FingerprintMismatch" in refused.stdout
    assert "sampling.temperature: 0.6 -> 0.9" in refused.stdout
    assert "started 1 server replica" not in refused.stdout
