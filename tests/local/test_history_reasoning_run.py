"""generation.historyReasoning end to end (`datagen run --standin`, examples/regenerate.yaml on Kimi-K2-Thinking, whose
template keeps the reasoning of every answer after the first): with `drop` every later turn is sent without the
model's earlier reasoning (the preflight, the canary's second turn, the workers), `datagen verify` without the run
file proves every turn from the output's fingerprint, and a resume with `keep` is refused naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from datagen_operator.api.commands import VerifyCommand
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.conversation import AnswerSplit, plan_turns, turn_messages
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.render import Renderer, load_tokenizer
from tests.local.runs import FAST_SIM, datagen_run
from tests.manifests import DELETE, EXAMPLES, example_run
from tests.programs import run_program


def _run_file(tmp_path: Path, history_reasoning: str) -> Path:
    document = example_run(
        "regenerate",
        **{
            "spec.model.preset": "kimi-k2-thinking",
            "spec.model.path": str(tmp_path / "model"),  # --standin builds it there
            "spec.dataset.path": str(tmp_path / "regenerate.jsonl"),
            "spec.output.path": str(tmp_path / "out"),
            "spec.generation.thinking": DELETE,  # K2-Thinking always thinks: no switch
            "spec.generation.historyReasoning": history_reasoning,
        },
    )
    run_file = tmp_path / f"{history_reasoning}.yaml"
    run_file.write_text(yaml.safe_dump(document))
    return run_file


def test_drop_sends_no_earlier_reasoning_verify_proves_it_and_a_resume_with_keep_is_refused(tmp_path: Path) -> None:
    dataset = Path(shutil.copy(EXAMPLES / "prompts" / "regenerate.jsonl", tmp_path))
    result = datagen_run(_run_file(tmp_path, "drop"), "--standin", *FAST_SIM)
    said = " ".join(result.stdout.split())
    assert result.returncode == 0, said[-3000:]
    assert "Succeeded=True (Completed)" in said

    output = tmp_path / "out"
    by_conversation: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for record in iter_records(output):
        by_conversation.setdefault((record["id"], record["sample"]), {})[record["turn"]] = record
    plan = plan_shard(DatasetRef(dataset), 0, 1)
    messages = {ref.id: plan.load(ref).messages for ref in plan.prompts}
    renderer = Renderer(load_tokenizer(tmp_path / "model", trust_remote_code=True), {})
    later_turns = differ = 0
    for (prompt_id, _), records in by_conversation.items():
        turns = plan_turns(messages[prompt_id])
        answers = [AnswerSplit(records[k]["answer_content"], records[k]["answer_reasoning"]) for k in sorted(records)]
        for turn in sorted(records)[2:]:
            later_turns += 1
            stored = records[turn]["input_ids"]
            sent = turn_messages(turns, turn, answers, history_reasoning="drop")
            kept = turn_messages(turns, turn, answers, history_reasoning="keep")
            assert stored == renderer.render(sent, None), f"{prompt_id} turn {turn + 1}"
            differ += stored != renderer.render(kept, None)
            assert answers[turn - 1].reasoning_content not in renderer.tokenizer.decode(stored)
    # From turn 3 on Kimi-K2-Thinking's template would have held answer 2's reasoning: each such turn is proof.
    assert later_turns >= 10 and differ == later_turns

    verified = run_program(VerifyCommand(output=str(output), json=True))  # no run file: the fingerprint says drop
    fidelity = next(check for check in json.loads(verified.stdout)["checks"] if check["name"] == "prompt_fidelity")
    assert fidelity["passed"], fidelity

    refused = datagen_run(_run_file(tmp_path, "keep"), "--standin", *FAST_SIM)
    said = " ".join(refused.stdout.split())
    assert refused.returncode != 0
    assert 'history_reasoning: "drop" -> (absent)' in said, said[-3000:]
