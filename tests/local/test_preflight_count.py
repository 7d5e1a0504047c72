"""The preflight's verdict carries the dataset's count of valid prompts: the run's progress total before any
worker has read the dataset (control/decide.progress_of). Lines set aside are not prompts."""

from __future__ import annotations

from pathlib import Path

import orjson

from datagen_operator.api import load_run
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.checks.preflight import run_preflight
from datagen_operator.prompts.render import load_tokenizer
from tests.local.runs import PROMPTS, manifest


def test_a_passed_preflight_counts_the_datasets_valid_prompts(tmp_path: Path, standin_tokenizer: Path) -> None:
    good = [line for line in PROMPTS.read_bytes().splitlines() if line.strip()]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"\n".join([*good, good[0], b"{not json"]) + b"\n")  # a duplicate, a bad line: set aside
    spec = load_run(manifest(tmp_path, standin_tokenizer, dataset=dataset)).spec
    outcome = run_preflight(
        spec, load_tokenizer(standin_tokenizer, trust_remote_code=False), standin_tokenizer, dataset, tmp_path / "out"
    )
    assert outcome.passed, outcome.message
    assert outcome.prompts == len({orjson.loads(line)["id"] for line in good}) == len(good)
    assert StepOutcome.from_storage(outcome.for_storage()).prompts == len(good), "the count reaches the operator"
