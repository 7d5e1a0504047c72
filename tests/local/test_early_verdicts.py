"""Verdicts the preflight can give are given there, before any server starts, by the rolling checks' own rules:
a dataset over the set-aside thresholds, prompts too long for the model's context, a resume over an output whose
records already fail a check. Counted: the refusal's numbers, and no server log written."""

from __future__ import annotations

from pathlib import Path

import orjson

from datagen_operator.api import load_run
from datagen_operator.api.commands import VerifyCommand
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.preflight import run_preflight
from tests.harness.sim import start_sim
from tests.local.runs import FAST_SIM, PROMPTS, datagen_run, manifest
from tests.programs import one_shard_worker, run_program


def _mixed_dataset(path: Path) -> Path:
    """5 good prompts, 8 unusable lines (bad JSON, no id, no messages, bad tools; 2 duplicates): 8/13 set aside."""
    good = [orjson.loads(line) for line in PROMPTS.read_bytes().splitlines() if line.strip()][:5]
    bad = [
        b"{not json",
        b'{"id": null, "messages": [{"role": "user", "content": "no id"}]}',
        b'{"id": "no-messages"}',
        b'{"id": "bad-tools", "messages": [{"role": "user", "content": "x"}], "tools": "nope"}',
        b"[1, 2, 3]",
        orjson.dumps(good[0]),
        orjson.dumps(good[1]),
        b'{"id": 7.5, "messages": []}',
    ]
    path.write_bytes(b"\n".join([*map(orjson.dumps, good), *bad]) + b"\n")
    return path


def test_a_dataset_over_the_malformed_threshold_is_refused_before_any_server(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    run_file = manifest(tmp_path, standin_tokenizer, dataset=_mixed_dataset(tmp_path / "mixed.jsonl"))
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "InputsVerified=False (DatasetUnusable)" in text, text
    assert "malformed 6/13 = 46.2%, threshold 10.0%" in text, text  # the two repeated lines are duplicates
    assert "line 6: bad JSON" in text  # the first lines of each cause, by number
    assert not (tmp_path / "out" / "logs" / "server-0.log").exists(), "no server may be started"
    assert not list((tmp_path / "out").glob("shards/*")), "no worker may be started"
    # Nothing points at files that do not exist: no verify of an empty output, no server logs.
    assert "no record was written to" in text and "(datagen verify" not in text
    verify = run_program(VerifyCommand(output=str(tmp_path / "out")))
    assert verify.returncode == 1 and "with no record in it" in verify.stdout + verify.stderr
    assert "server logs in" not in verify.stdout + verify.stderr


def test_prompts_too_long_for_the_models_context_are_refused_at_the_preflight(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    # Every quickstart prompt renders to more than 6 tokens: with a 1030-token context and 1024 new tokens, all
    # are too long, the server's own limit would set them aside one by one after a model load.
    run_file = manifest(tmp_path, standin_tokenizer, **{"server.extraArgs": ["--context-length", "1030"]})
    spec = load_run(run_file).spec
    outcome = run_preflight(
        spec, load_tokenizer(standin_tokenizer, trust_remote_code=False), standin_tokenizer, PROMPTS, tmp_path / "out"
    )
    prompts = sum(1 for line in PROMPTS.read_bytes().splitlines() if line.strip())
    assert not outcome.passed and outcome.reason == "DatasetUnusable"
    assert f"too_long {prompts}/{prompts} = 100.0%, threshold 10.0%" in outcome.message, outcome.message
    assert "exceeds the server's context length of 1030 tokens" in outcome.message
    # The model's own context (its config) holds them: the same dataset passes.
    fits = load_run(manifest(tmp_path, standin_tokenizer)).spec
    assert run_preflight(
        fits, load_tokenizer(standin_tokenizer, trust_remote_code=False), standin_tokenizer, PROMPTS, tmp_path / "out"
    ).passed


def test_a_resume_over_records_that_already_fail_is_refused_before_any_server(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    """The output already holds records whose output_ids start with the prompt's tail (the upstream SGLang bug):
    token_counts fails at 0%; the resume is refused naming counts, rate, threshold and the fix."""
    run_file = manifest(tmp_path, standin_tokenizer, **{"clients.shards": 1})
    leaking = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-prompt-suffix-leak", "3")
    with start_sim(*leaking) as sim:
        worker = run_program(one_shard_worker(run_file, tmp_path / "out", sim.url))
    assert worker.returncode == 0, worker.stdout + worker.stderr
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    records = sum(1 for line in PROMPTS.read_bytes().splitlines() if line.strip())
    assert "InputsVerified=False (OutputFailsChecks)" in text, text
    assert f"token_counts {records}/{records} = 100.0%, threshold 0.0%" in text, text
    assert "spec.checks.maxTokenMismatchRate" in text and "a new spec.output.path" in text
    assert "--exclude-flags prompt_suffix_leak,token_count_mismatch" in text
    assert not (tmp_path / "out" / "logs" / "server-0.log").exists(), "no server may be started"


def test_a_missing_dataset_is_refused_naming_the_field(tmp_path: Path, standin_tokenizer: Path) -> None:
    """The same words in a cluster (the preflight pod's verdict) as on one machine: the field, then the cause."""
    missing = tmp_path / "nowhere.jsonl"
    spec = load_run(manifest(tmp_path, standin_tokenizer, dataset=missing)).spec
    tokenizer = load_tokenizer(standin_tokenizer, trust_remote_code=True)
    outcome = run_preflight(spec, tokenizer, standin_tokenizer, missing, tmp_path / "out")
    assert (outcome.passed, outcome.reason) == (False, "DatasetUnusable")
    assert outcome.message.startswith(f"spec.dataset.path {missing}: "), outcome.message
