"""Template variables: a run's generation.templateVariables and a line's own chat_template_kwargs (Qwen3's
enable_thinking per line) are rendered, recorded, and hold the checks: a thinking-off line must not reason, a
thinking-on line must."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.errors import SpecError
from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.flags import UNEXPECTED_REASONING
from datagen_operator.api.resolve import resolve_model
from datagen_operator.checks.record_checks import expectations_for
from datagen_operator.engine.model_configs import read_model_eos_ids
from datagen_operator.output.readers import RecordBatches, iter_records
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.line_shape import INVALID_TEMPLATE_KWARGS
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.render import Renderer, line_thinking, load_tokenizer, template_variables
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import local_spec
from tests.worker.simrun import run_inprocess, write_dataset

QWEN_FLAGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
              "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3")  # fmt: skip


def _qwen() -> Path:
    return ensure_standin_tokenizer(family="qwen3")


def _spec(dataset: Path, output: Path, **changes: Any) -> dict[str, Any]:
    return local_spec(_qwen(), dataset, output, **{"model.preset": "qwen3", **changes})


def _lines() -> list[dict[str, Any]]:
    out = []
    for i in range(12):
        line: dict[str, Any] = {"id": f"q{i:02d}", "messages": [{"role": "user", "content": f"question {i}?"}]}
        if i % 3 == 1:
            line["chat_template_kwargs"] = {"enable_thinking": False}
        elif i % 3 == 2:
            line["chat_template_kwargs"] = {"enable_thinking": True}
        out.append(line)
    return out


def test_a_lines_own_thinking_switch_is_rendered_recorded_and_judged(tmp_path: Path) -> None:
    items = _lines()
    output = tmp_path / "out"
    document = _spec(write_dataset(tmp_path / "lines.jsonl", items), output)
    with start_sim(*QWEN_FLAGS, tokenizer_dir=_qwen()) as server:
        assert run_inprocess(document, [server.url]) == EXIT_OK
    spec = parse_spec(document)
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(_qwen(), trust_remote_code=False)
    renderer = Renderer(tokenizer, template_variables(resolved))
    by_id = {item["id"]: item for item in items}
    records = {r["id"]: r for r in iter_records(output)}
    assert len(records) == 12
    for prompt_id, record in records.items():
        line = by_id[prompt_id].get("chat_template_kwargs")
        assert record["input_ids"] == renderer.reference(by_id[prompt_id]["messages"], None, line)
        assert record["thinking"] == (line_thinking(resolved, line) if line else None)
        text = tokenizer.decode(record["input_ids"])
        # Qwen3's template closes the think block itself when thinking is off for the line.
        assert text.endswith("<think>\n\n</think>\n\n") == (line == {"enable_thinking": False}), text[-40:]
        assert record["flags"] == [], (prompt_id, record["flags"])
    report = verify_output(output, spec, tokenizer=tokenizer)
    assert report.passed, [c.verdict for c in report.checks if not c.passed]


def test_verify_judges_each_record_by_its_lines_thinking(tmp_path: Path) -> None:
    """The same stored records judged as if every line had thinking on: the off lines' answers (no reasoning)
    raise nothing because their column says off; drop the column and they would."""
    from datagen_operator.checks.record_columns import batch_flags

    items = _lines()
    output = tmp_path / "out"
    document = _spec(write_dataset(tmp_path / "lines.jsonl", items), output)
    with start_sim(*QWEN_FLAGS, tokenizer_dir=_qwen()) as server:
        assert run_inprocess(document, [server.url]) == EXIT_OK
    resolved = resolve_model(parse_spec(document))
    expect = expectations_for(resolved, load_tokenizer(_qwen(), trust_remote_code=False), read_model_eos_ids(_qwen()))
    columns = ("input_ids", "output_ids", "finish_reason", "completion_tokens", "has_tools", "thinking")
    [batch] = list(RecordBatches(output, columns, rows=64))
    assert not batch_flags(batch, expect).counts()
    # A thinking-off line that reasoned: judged by its own switch, it is flagged.
    on_rows = [i for i, t in enumerate(batch.column("thinking").to_pylist()) if t is not False]
    taken = batch.take(on_rows)
    switched = taken.set_column(taken.schema.get_field_index("thinking"), "thinking", pa.array([False] * len(on_rows)))
    assert batch_flags(switched, expect).counts()[UNEXPECTED_REASONING] == len(on_rows)


def test_run_level_template_variables_are_rendered_and_fingerprinted_and_the_switch_is_refused(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "lines.jsonl", _lines()[:2])
    spec = parse_spec(_spec(dataset, tmp_path / "out", **{"generation.templateVariables": {"custom_flag": 1}}))
    assert template_variables(resolve_model(spec))["custom_flag"] == 1
    with pytest.raises(SpecError, match=r"enable_thinking is the template.s thinking switch"):
        resolve_model(
            parse_spec(_spec(dataset, tmp_path / "o", **{"generation.templateVariables": {"enable_thinking": False}}))
        )


def test_a_lines_template_kwargs_must_be_an_object_and_may_not_set_what_the_renderer_gives(tmp_path: Path) -> None:
    lines = [
        {"id": "a", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "enable_thinking"},
        {"id": "b", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}},
        {
            "id": "c",
            "messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": {"reasoning_effort": "low"},
        },
    ]
    plan = plan_shard(DatasetRef(write_dataset(tmp_path / "d.jsonl", lines)), 0, 1)
    assert [ref.id for ref in plan.prompts] == ["c"]
    causes = {line.id: (line.cause, line.reason) for line in plan.malformed}
    assert causes["a"][0] == causes["b"][0] == INVALID_TEMPLATE_KWARGS
    assert "must be an object" in causes["a"][1] and "may not set tools" in causes["b"][1]
    assert plan.load(plan.prompts[0]).variables == {"reasoning_effort": "low"}


def _every_third_off() -> list[dict[str, Any]]:
    """The issue's case: thinking on for the run, `enable_thinking: false` on every third line."""
    out = []
    for i in range(12):
        line: dict[str, Any] = {"id": f"t{i:02d}", "messages": [{"role": "user", "content": f"question {i}?"}]}
        if i % 3 == 2:
            line["chat_template_kwargs"] = {"enable_thinking": False}
        out.append(line)
    return out


def test_thinking_off_on_every_third_line_passes_the_canary_the_run_and_verify(tmp_path: Path) -> None:
    """The canary judges each prompt by its line's own switch, as the workers and verify do: the off lines' closed
    think blocks and unreasoned answers are what they asked for, not a template rendering thinking off."""
    import asyncio

    from datagen_operator.steps.canary import run_canary

    output = tmp_path / "out"
    document = _spec(write_dataset(tmp_path / "lines.jsonl", _every_third_off()), output, **{"checks.canaryPrompts": 8})
    spec = parse_spec(document)
    tokenizer = load_tokenizer(_qwen(), trust_remote_code=False)
    with start_sim(*QWEN_FLAGS, tokenizer_dir=_qwen()) as server:
        canary = asyncio.run(run_canary(spec, tokenizer, Path(spec.dataset.path), [server.url]))
        assert canary.passed, canary.message
        template = next(c for c in canary.checks if c.name == "chat_template")
        assert template.passed and template.total == 11, template.verdict  # 3 probes, 8 lines (2 of them off)
        assert "(thinking on; 2 thinking off by their line's own switch)" in template.verdict, template.verdict
        assert run_inprocess(document, [server.url]) == EXIT_OK
    records = list(iter_records(output))
    assert sum(r["thinking"] is False for r in records) == 4 and len(records) == 12
    report = verify_output(output, spec, tokenizer=tokenizer)
    assert report.passed, [c.verdict for c in report.checks if not c.passed]


@pytest.mark.parametrize("preset", [None, "qwen3", "kimi-k2.5", "gpt-oss", "deepseek-r1"])
def test_the_exports_reading_of_the_fingerprint_is_what_the_run_renders_with(
    preset: str | None, tmp_path: Path
) -> None:
    """The conversations export carries the run's chat-template keyword arguments read back from the output's
    fingerprint: they are exactly the run's own (templateVariables and the thinking switch), for every preset."""
    from datagen_operator.output.fingerprint import build_fingerprint
    from datagen_operator.prompts.render import fingerprint_template_kwargs

    dataset = write_dataset(tmp_path / "lines.jsonl", _lines()[:1])
    changes: dict[str, Any] = {"model.preset": preset, "generation.templateVariables": {"custom_flag": 1}}
    if preset is None:
        changes |= {"server.reasoningParser": "qwen3", "server.toolCallParser": "qwen25"}
    resolved = resolve_model(parse_spec(_spec(dataset, tmp_path / "out", **changes)))
    fingerprint = build_fingerprint(
        tokenizer={}, chat_template=None, server={}, sampling={},
        preset=resolved.preset.name if resolved.preset else None, thinking=resolved.thinking,
        template_variables=resolved.template_variables,
    )  # fmt: skip
    assert fingerprint_template_kwargs(fingerprint) == template_variables(resolved)
    assert template_variables(resolved)["custom_flag"] == 1
