"""Distinct samples: with samplesPerPrompt > 1 and temperature > 0, SGLang samples each request anew, so the
samples of one prompt differ; a server that gives every sample one seed (--enable-deterministic-inference with
no sampling_seed: seed 42 for all) answers them alike. The canary, the worker's counts (the rolling checks) and
verify judge it by one rule (checks.samples, checks.evaluate IDENTICAL_SAMPLES); greedy sampling with more
than one sample is refused by the spec itself."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.errors import SpecError
from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.status import CheckResult
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.canary import run_canary
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import local_spec
from tests.worker.simrun import progress, run_inprocess, write_dataset

QWEN_FLAGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
              "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3")  # fmt: skip
PROMPTS = 12
CANARY = 8 + 3  # the dataset prompts and the built-in probes


def _qwen() -> Path:
    return ensure_standin_tokenizer(family="qwen3")


def _document(tmp_path: Path, name: str, **changes: Any) -> dict[str, Any]:
    lines = [{"id": f"q{i:02d}", "messages": [{"role": "user", "content": f"question {i}?"}]} for i in range(PROMPTS)]
    dataset = write_dataset(tmp_path / "lines.jsonl", lines)
    changes = {"model.preset": "qwen3", "generation.samplesPerPrompt": 2, "checks.canaryPrompts": 8, **changes}
    return local_spec(_qwen(), dataset, tmp_path / name, **changes)


def _check(checks: tuple[CheckResult, ...] | list[CheckResult]) -> CheckResult:
    return next(c for c in checks if c.name == "identical_samples")


def _run(document: dict[str, Any], *sim_flags: str) -> tuple[Any, dict[str, Any], Any]:
    """The canary, the run and verify of `document` on one simulator: (canary, the worker's progress, verify)."""
    spec = parse_spec(document)
    tokenizer = load_tokenizer(_qwen(), trust_remote_code=False)
    output = Path(spec.output.path)
    with start_sim(*QWEN_FLAGS, *sim_flags, tokenizer_dir=_qwen()) as server:
        canary = asyncio.run(run_canary(spec, tokenizer, Path(spec.dataset.path), [server.url]))
        assert run_inprocess(document, [server.url]) == EXIT_OK
    assert len(list(iter_records(output))) == 2 * PROMPTS
    return canary, progress(output), verify_output(output, spec, tokenizer=tokenizer)


def test_samples_of_a_prompt_differ_and_every_stage_counts_them(tmp_path: Path) -> None:
    canary, snapshot, report = _run(_document(tmp_path, "out"))
    assert canary.passed, canary.message
    check = _check(canary.checks)
    assert check.passed and (check.count, check.total) == (0, CANARY), check.verdict
    assert (snapshot["sampled_prompts"], snapshot["identical_samples"]) == (PROMPTS, 0)
    check = _check(report.checks)
    assert report.passed and (check.count, check.total) == (0, PROMPTS), check.verdict
    assert f"the samples of {PROMPTS}/{PROMPTS} prompts differ" in check.verdict


def test_one_seed_for_every_sample_fails_the_canary_the_rolling_counts_and_verify(tmp_path: Path) -> None:
    # A server started with --enable-deterministic-inference (one the run does not own) gives every unseeded
    # request seed 42: both samples of each prompt are the same answer.
    canary, snapshot, report = _run(_document(tmp_path, "out"), "--enable-deterministic-inference")
    assert not canary.passed
    check = _check(canary.checks)
    assert not check.passed and (check.count, check.total) == (CANARY, CANARY)
    assert f"{CANARY}/{CANARY} prompts got identical samples" in canary.message
    assert "--enable-deterministic-inference" in check.verdict and "generation.sampling.sampling_seed" in check.verdict
    assert (snapshot["sampled_prompts"], snapshot["identical_samples"]) == (PROMPTS, PROMPTS)
    check = _check(report.checks)
    assert not report.passed and not check.passed and (check.count, check.total) == (PROMPTS, PROMPTS)

    # The fix the verdict names: a sampling_seed, sent as seed + k for sample k.
    canary, snapshot, report = _run(
        _document(tmp_path, "seeded", **{"generation.sampling.sampling_seed": 5}), "--enable-deterministic-inference"
    )
    assert canary.passed and _check(canary.checks).count == 0, canary.message
    assert (snapshot["sampled_prompts"], snapshot["identical_samples"]) == (PROMPTS, 0)
    assert report.passed and _check(report.checks).count == 0


@pytest.mark.parametrize("greedy", [{"temperature": 0}, {"temperature": 0.7, "top_k": 1}])
def test_greedy_sampling_with_two_samples_is_refused_by_the_spec(tmp_path: Path, greedy: dict[str, Any]) -> None:
    changes = {f"generation.sampling.{key}": value for key, value in greedy.items()}
    with pytest.raises(SpecError) as refused:
        parse_spec(_document(tmp_path, "out", **changes))
    assert "spec.generation.samplesPerPrompt: samplesPerPrompt 2 with greedy sampling" in str(refused.value)
    assert "set generation.sampling.temperature above 0" in str(refused.value)
    parse_spec(_document(tmp_path, "out", **changes, **{"generation.samplesPerPrompt": 1}))
