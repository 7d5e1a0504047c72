"""The preflight's verdict carries the dataset's count of valid prompts: the run's progress total before any
worker has read the dataset (control/progress.progress_of). Lines set aside are not prompts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from datagen_operator.api import load_run
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.rendered import LINE_DTYPE, LINES_FILE
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.preflight import run_preflight
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


def test_a_system_only_line_after_a_valid_one_is_set_aside_in_order_under_turns_all(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    # It used to be stored before the batch holding the line above it: "rendered store: line 0 after line 1".
    lines = [
        {"id": "chat", "messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]},
        {"id": "system-only", "messages": [{"role": "system", "content": "x"}]},
        {"id": "chat-2", "messages": [{"role": "user", "content": "And you?"}]},
    ]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    spec = load_run(manifest(tmp_path, standin_tokenizer, dataset=dataset, **{"generation.turns": "all"})).spec
    outcome = run_preflight(
        spec, load_tokenizer(standin_tokenizer, trust_remote_code=False), standin_tokenizer, dataset, tmp_path / "out"
    )
    assert outcome.passed, outcome.message
    assert outcome.prompts == 3 and "(1 set aside)" in outcome.message
    stored = np.frombuffer((OutputLayout(tmp_path / "out").rendered / LINES_FILE).read_bytes(), dtype=LINE_DTYPE)
    assert [int(count) > 0 for count in stored["count"]] == [True, False, True], "lines stored in dataset order"


def test_an_empty_user_message_is_answered_and_the_preflight_counts_it(tmp_path: Path, standin_tokenizer: Path) -> None:
    # SGLang's chat endpoint refuses no empty user message: the template renders an empty user turn, answered.
    lines = [
        {"id": "empty", "messages": [{"role": "user", "content": ""}]},
        {"id": "no-text", "messages": [{"role": "user", "content": []}]},
        {"id": "spaces", "messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]},
        {"id": "fine", "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe rain."}]}]},
    ]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    spec = load_run(manifest(tmp_path, standin_tokenizer, dataset=dataset)).spec
    outcome = run_preflight(
        spec, load_tokenizer(standin_tokenizer, trust_remote_code=False), standin_tokenizer, dataset, tmp_path / "out"
    )
    assert outcome.passed, outcome.message
    assert outcome.prompts == 4 and "set aside" not in outcome.message
    assert "3 lines hold an empty user message (e.g. line 1 (id 'empty')): it is sent as it is" in outcome.message
