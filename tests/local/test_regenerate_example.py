"""examples/regenerate.yaml, as a user runs it (`datagen run --standin`), for each model family the field regenerates
with: its ShareGPT dataset (system messages, a tool turn, a line without an id) regenerated turn by turn, every turn
proved by verify from the run's own answers. Counted: turns planned and recorded, the turn cut at the tool message."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from datagen_operator.api.commands import VerifyCommand
from datagen_operator.output.readers import iter_records, iter_rejects
from tests.local.runs import FAST_SIM, datagen_run
from tests.manifests import EXAMPLES, example_run
from tests.programs import run_program

FAMILIES = ("kimi-k2.5", "qwen3", "deepseek-r1", "gpt-oss")


def run_example(
    tmp_path: Path, example: str, dataset: str, **model: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """`datagen run --standin` on an example with its dataset copied here, the stand-in model built here (`model`:
    changes to spec.model) and the output here; the result and its stdout on one line."""
    document = example_run(
        example.removesuffix(".yaml"),
        **{
            "spec.model.path": str(tmp_path / "model"),  # --standin builds it there
            **{f"spec.model.{key}": value for key, value in model.items()},
            "spec.dataset.path": str(shutil.copy(EXAMPLES / "prompts" / dataset, tmp_path)),
            "spec.output.path": str(tmp_path / "out"),
        },
    )
    run_file = tmp_path / example
    run_file.write_text(yaml.safe_dump(document))
    result = datagen_run(run_file, "--standin", *FAST_SIM)
    return result, " ".join(result.stdout.split())


@pytest.mark.parametrize("preset", FAMILIES)
def test_the_regenerate_example_completes_for_each_family(tmp_path: Path, preset: str) -> None:
    result, said = run_example(tmp_path, "regenerate.yaml", "regenerate.jsonl", preset=preset)
    assert result.returncode == 0, said[-3000:]
    assert "60 user turns to answer in 23 conversations" in said
    assert "1 user turn after a tool message not regenerated" in said  # one noun, one count (api/words.py)
    assert "Succeeded=True (Completed): 60/60 turns (23/23 conversations); verification passed" in said
    assert re.search(
        r"DataFaithful=True \(WithinThresholds\): \d+ checks pass over \d+ records; records by turn: 1: ", said
    )
    records = list(iter_records(tmp_path / "out"))
    verified = run_program(VerifyCommand(output=str(tmp_path / "out"), json=True))
    report = json.loads(verified.stdout)
    fidelity = next(check for check in report["checks"] if check["name"] == "prompt_fidelity")
    # Every turn of the sampled conversations (fidelitySample 64 records: all 23 here) rebuilt and proved.
    assert fidelity["passed"] and fidelity["total"] == len(records) == 60 - _turns_cut(tmp_path / "out")
    keys = Counter((r["id"], r["sample"], r["turn"]) for r in records)
    assert max(keys.values()) == 1
    assert {r["turn"] for r in records if r["id"] == "sharegpt-tools-021"} == {0}
    assert any(r["id"].startswith("sha256:") for r in records)  # the line without an id, by its content


def _turns_cut(output: Path) -> int:
    """Turns a conversation ended before (an unfinished or tool-calling answer), as rejects.jsonl lists them."""
    return sum(e["turns"] - e["turn"] for e in iter_rejects(output) if e.get("kind") == "turns")


def test_the_gpt_oss_tools_example_ends_each_conversation_at_the_models_own_tool_call(tmp_path: Path) -> None:
    """examples/regenerate-gpt-oss.yaml: every line declares tools; an answer that calls one (harmony's commentary
    message to=functions.NAME ending in <|call|>) keeps the call and ends its conversation, the turns after it
    counted as answer_called_tool; no history holds an answer the model never gave; verify proves every turn."""
    result, said = run_example(tmp_path, "regenerate-gpt-oss.yaml", "regenerate-tools.jsonl")
    assert result.returncode == 0, said[-3000:]
    assert "26 user turns to answer in 10 conversations" in said
    records = list(iter_records(tmp_path / "out"))
    called = [r for r in records if r["answer_tool_calls"]]
    cut = [e for e in iter_rejects(tmp_path / "out") if e.get("kind") == "turns"]
    assert called and {e["cause"] for e in cut} == {"answer_called_tool"}
    planned = {
        line["id"]: sum(m["role"] == "user" for m in line["messages"])
        for line in map(json.loads, (EXAMPLES / "prompts" / "regenerate-tools.jsonl").read_text().splitlines())
    }
    ended = {(r["id"], r["turn"] + 1) for r in called if r["turn"] + 1 < planned[r["id"]]}
    assert {(e["id"], e["turn"]) for e in cut} == ended and ended  # each cut right after a call, none other
    assert len(records) + _turns_cut(tmp_path / "out") == sum(planned.values()) == 26
    for record in called:
        assert {call["name"] for call in record["answer_tool_calls"]} <= {"get_weather", "get_time", "search_flights"}
        assert all(isinstance(json.loads(call["arguments"]), dict) for call in record["answer_tool_calls"])
    assert "Succeeded=True (Completed): 26/26 turns (10/10 conversations); verification passed" in said
    verified = run_program(VerifyCommand(output=str(tmp_path / "out"), json=True))
    report = json.loads(verified.stdout)
    fidelity = next(check for check in report["checks"] if check["name"] == "prompt_fidelity")
    assert fidelity["passed"] and fidelity["total"] == len(records)
    completeness = next(check for check in report["checks"] if check["name"] == "completeness")
    assert f"turns not sent: {_turns_cut(tmp_path / 'out')} answer_called_tool" in completeness["verdict"]
