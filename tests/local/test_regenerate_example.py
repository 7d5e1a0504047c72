"""examples/regenerate.yaml, as a user runs it (`datagen run --standin`), for each model family the field regenerates
with: its ShareGPT dataset (system messages, a tool turn, a line without an id) regenerated turn by turn, every turn
proved by verify from the run's own answers. Counted: turns planned and recorded, the turn cut at the tool message."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml

from datagen_operator.api.commands import VerifyCommand
from datagen_operator.output.readers import iter_records, iter_rejects
from tests.local.runs import FAST_SIM, datagen_run
from tests.manifests import EXAMPLES
from tests.programs import run_program

FAMILIES = ("kimi-k2.5", "qwen3", "deepseek-r1", "gpt-oss")


@pytest.mark.parametrize("preset", FAMILIES)
def test_the_regenerate_example_completes_for_each_family(tmp_path: Path, preset: str) -> None:
    document = yaml.safe_load((EXAMPLES / "regenerate.yaml").read_text())
    spec = document["spec"]
    spec["model"].update(preset=preset, path=str(tmp_path / "model"))  # --standin builds it there
    spec["dataset"]["path"] = str(shutil.copy(EXAMPLES / "prompts" / "regenerate.jsonl", tmp_path))
    spec["output"]["path"] = str(tmp_path / "out")
    run_file = tmp_path / "regenerate.yaml"
    run_file.write_text(yaml.safe_dump(document))
    result = datagen_run(run_file, "--standin", *FAST_SIM)
    said = " ".join(result.stdout.split())
    assert result.returncode == 0, said[-3000:]
    assert "60 user turns to answer in 23 conversations" in said
    assert "1 user turns after a tool message not regenerated" in said
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
