"""generation.templateVariableMix: gpt-oss's reasoning_effort drawn per line from weighted choices (SpecForge's
regenerate_train_data.py draws low/medium/high 4/4/2), seeded by the line's id: rendered as the line's own
chat_template_kwargs would be, recorded per record, the same after a kill -9 and resume and with any shard count,
and fingerprinted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.errors import SpecError
from datagen_operator.api.exit_codes import EXIT_FINGERPRINT_MISMATCH, EXIT_OK
from datagen_operator.api.resolve import resolve_model
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import Renderer, load_tokenizer, template_variables
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import local_spec
from tests.worker.simrun import kill_9_after_records, run_inprocess, write_dataset
from tests.worker.test_multiturn import GPT_OSS_SIM
from tests.worker.test_worker_crash import PACED

LINES = 150
OWN_EVERY = 15
"""Every 15th line sets its own reasoning_effort (high), which wins over the draw."""
WEIGHTS = {"low": 4, "medium": 4, "high": 2}
MIX = {"seed": 5, "variables": {"reasoning_effort": [{"value": v, "weight": w} for v, w in WEIGHTS.items()]}}


def _model() -> Path:
    return ensure_standin_tokenizer(family="gpt-oss")


def _items() -> list[dict[str, Any]]:
    items = []
    for i in range(LINES):
        item: dict[str, Any] = {"id": f"m{i:03d}", "messages": [{"role": "user", "content": f"question {i}?"}]}
        if i % OWN_EVERY == 0:
            item["chat_template_kwargs"] = {"reasoning_effort": "high"}
        items.append(item)
    return items


def _spec(dataset: Path, output: Path, **changes: Any) -> dict[str, Any]:
    return local_spec(
        _model(), dataset, output,
        **{"model.preset": "gpt-oss", "generation.sampling.max_new_tokens": 512, "generation.templateVariableMix": MIX,
           "clients.concurrency": 16, "clients.requestTimeout": "30s", **changes},
    )  # fmt: skip


def _efforts(output: Path) -> dict[str, str]:
    """id -> the reasoning_effort its record says the line rendered with."""
    out = {}
    for record in iter_records(output):
        fields = orjson.loads(record["source_fields"])
        out[record["id"]] = fields["chat_template_kwargs"]["reasoning_effort"]
    return out


def test_an_effort_mix_is_drawn_per_line_recorded_resumed_alike_and_judged(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    items = _items()
    dataset = write_dataset(tmp_path / "lines.jsonl", items)
    output, log = tmp_path / "out", tmp_path / "worker.log"
    document = _spec(dataset, output)
    with start_sim(*GPT_OSS_SIM, *PACED, "--sim-tokens-per-s", "200", tokenizer_dir=_model()) as server:
        kill_9_after_records(document, server.url, log, at_least=5)
        before_resume = _efforts_in_segments(OutputLayout(output))
        assert 0 < len(before_resume) < LINES
        assert run_inprocess(document, [server.url]) == EXIT_OK
        # Another output of the same mix with two shards draws the same value for every line.
        two = _spec(dataset, tmp_path / "two", **{"clients.shards": 2})
        for shard in range(2):
            assert run_inprocess(two, [server.url], "--shard-index", str(shard), "--shard-count", "2") == EXIT_OK
        # Another mix into this output: refused, naming the field.
        other = _spec(dataset, output, **{"generation.templateVariableMix": {**MIX, "seed": 6}})
        capfd.readouterr()
        assert run_inprocess(other, [server.url]) == EXIT_FINGERPRINT_MISMATCH
        assert "generation.templateVariableMix.seed: 5 -> 6" in capfd.readouterr().err

    efforts = _efforts(output)
    assert len(efforts) == LINES
    assert {k: efforts[k] for k in before_resume} == before_resume  # the resume drew what the killed run drew
    assert _efforts(tmp_path / "two") == efforts
    own = {item["id"] for item in items if "chat_template_kwargs" in item}
    assert {efforts[i] for i in own} == {"high"}  # a line's own value wins
    drawn = Counter(effort for prompt_id, effort in efforts.items() if prompt_id not in own)
    total = sum(drawn.values())
    for value, weight in WEIGHTS.items():  # 140 draws: about 56, 56, 28 (a 1/3 each draw would fail `high`)
        assert abs(drawn[value] / total - weight / 10) <= 0.08, drawn

    spec = parse_spec(document)
    tokenizer = load_tokenizer(_model(), trust_remote_code=False)
    renderer = Renderer(tokenizer, template_variables(resolve_model(spec)))
    by_id = {item["id"]: item for item in items}
    for record in iter_records(output):
        effort = efforts[record["id"]]
        expected = renderer.reference(by_id[record["id"]]["messages"], None, {"reasoning_effort": effort})
        assert record["input_ids"] == expected
        assert f"Reasoning: {effort}" in tokenizer.decode(record["input_ids"])
    report = verify_output(output, spec, tokenizer=tokenizer, dataset=dataset)
    assert report.passed, [c.verdict for c in report.checks if not c.passed]


def _efforts_in_segments(layout: OutputLayout) -> dict[str, str]:
    out = {}
    for segment in layout.segments(0):
        for line in segment.read_bytes().splitlines():
            record = orjson.loads(line)
            out[record["id"]] = orjson.loads(record["source_fields"])["chat_template_kwargs"]["reasoning_effort"]
    return out


def _refusal(mix: Any, **changes: Any) -> SpecError:
    document = _spec(Path("/d.jsonl"), Path("/out"), **{"generation.templateVariableMix": mix, **changes})
    with pytest.raises(SpecError) as refused:
        resolve_model(parse_spec(document))
    return refused.value


@pytest.mark.parametrize(
    ("mix", "field", "words"),
    [
        (
            {"variables": {"reasoning_effort": [{"value": "low", "weight": 0}]}},
            "spec.generation.templateVariableMix.variables.reasoning_effort[0].weight",
            "greater than 0",
        ),
        (
            {"variables": {"reasoning_effort": [{"value": "low", "weight": -2}]}},
            "spec.generation.templateVariableMix.variables.reasoning_effort[0].weight",
            "greater than 0",
        ),
        (
            {"variables": {"reasoning_effort": []}},
            "spec.generation.templateVariableMix.variables.reasoning_effort",
            "at least 1",
        ),
        ({"variables": {}}, "spec.generation.templateVariableMix.variables", "at least 1"),
        ({"seed": 1}, "spec.generation.templateVariableMix.variables", "required"),
        (
            {"variables": {"reasoning_effort": [{"weight": 1}]}},
            "spec.generation.templateVariableMix.variables.reasoning_effort[0].value",
            "required",
        ),
        (
            {"variables": {"tools": [{"value": [], "weight": 1}]}},
            "spec.generation.templateVariableMix.variables",
            "tools: the renderer gives the template these itself",
        ),
    ],
)
def test_a_bad_mix_is_refused_naming_the_field(mix: Any, field: str, words: str) -> None:
    refused = _refusal(mix)
    assert [e.field for e in refused.errors] == [field], refused
    assert words in str(refused)


def test_a_variable_both_mixed_and_set_for_the_run_is_refused_naming_both() -> None:
    refused = _refusal(MIX, **{"generation.templateVariables": {"reasoning_effort": "low"}})
    assert [e.field for e in refused.errors] == ["spec.generation.templateVariableMix.variables"]
    assert "reasoning_effort is also set in spec.generation.templateVariables" in str(refused)


def test_a_thinking_mix_in_regenerated_conversations_is_judged_per_line_and_exported_per_row(tmp_path: Path) -> None:
    """Qwen3's switch drawn per line (1:1) over whole regenerated conversations: each record's `thinking` is its
    line's draw, verify judges each line by it, and the conversations export's rows carry the draw, which a trainer
    renders every turn's prompt back with."""
    from datagen_operator.cli import main as datagen
    from tests.export.test_export_conversations import chats, qwen3_dir, read_rows, sim_run, whole_by_hand

    mix = {"seed": 2, "variables": {"enable_thinking": [{"value": True, "weight": 1}, {"value": False, "weight": 1}]}}
    flags = (
        "--sim-family", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
        "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3",
    )  # fmt: skip
    changes = {"model.preset": "qwen3", "model.path": str(qwen3_dir()), "generation.templateVariableMix": mix}
    (tmp_path / "run").mkdir()
    output = sim_run(tmp_path / "run", chats(16, lambda i: 1 + i % 2), flags, qwen3_dir(), **changes)
    drawn: dict[str, bool] = {}
    for record in iter_records(output):
        switch = orjson.loads(record["source_fields"])["chat_template_kwargs"]["enable_thinking"]
        assert drawn.setdefault(record["id"], switch) == switch  # every turn of a line: one draw
        assert record["thinking"] is switch
    assert set(drawn.values()) == {True, False}, drawn
    spec = parse_spec(_run_yaml_spec(output))  # as sim_run left it, as `datagen run` does
    tokenizer = load_tokenizer(qwen3_dir(), trust_remote_code=False)
    report = verify_output(output, spec, tokenizer=tokenizer)
    assert report.passed, [c.verdict for c in report.checks if not c.passed]

    out = tmp_path / "conversations"
    assert datagen(["export", str(output), "--format", "conversations", "--out", str(out)]) == EXIT_OK
    rows = read_rows(out)
    whole = whole_by_hand(output)
    assert rows and {(row["id"], row["sample"]) for row in rows} == set(whole)
    for row in rows:
        assert row["chat_template_kwargs"] == {"enable_thinking": drawn[row["id"]]}
        at = [i for i, message in enumerate(row["conversations"]) if message["role"] == "assistant"]
        for record, end in zip(whole[(row["id"], row["sample"])], at, strict=True):
            ids = tokenizer.apply_chat_template(
                row["conversations"][:end], tools=row["tools"], add_generation_prompt=True, tokenize=True,
                return_dict=False, **row["chat_template_kwargs"],
            )  # fmt: skip
            assert list(ids) == record["input_ids"]


def _run_yaml_spec(output: Path) -> dict[str, Any]:
    import yaml

    spec: dict[str, Any] = yaml.safe_load((output / "run.yaml").read_text())["spec"]
    return spec
