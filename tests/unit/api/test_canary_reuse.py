"""Bug 5: one rule for reusing a passed canary in both shells. A canary verdict holds for the spec's judged fields,
the tokenizer files and the chat template it was run for (api/canary_reuse.py); `datagen run` and the operator's
canary Job keep a pass in the output with that basis and reuse it for the same basis only. The operator reads no
files, so a run suspended after its canary and resumed before any worker asks its canary Job again."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import CANARY_PASSED, Condition, DataGenRunStatus, Phase
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from datagen_operator.control.observed import Observed
from datagen_operator.k8s.children import Child, Children, Create, WantedServer, plan
from datagen_operator.k8s.context import RunCache
from datagen_operator.k8s.observer import Observer
from datagen_operator.output.canary_verdict import canary_basis_here, remember_canary, remembered_canary
from tests.manifests import local_run, write_run
from tests.unit.decide_world import PASS, READY, context

PASSED = StepOutcome(True, Reason.PASSED, "4/4 canary outputs pass")
TEMPLATE = SimpleNamespace(chat_template="{{ messages }}")


@pytest.fixture
def run_file(tmp_path: Path, standin_tokenizer: Path) -> Path:
    tokenizer = shutil.copytree(standin_tokenizer, tmp_path / "tokenizer")
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    (tmp_path / "out").mkdir()
    return write_run(tmp_path / "run.yaml", local_run(tokenizer, dataset, tmp_path / "out"))


def change_tokenizer_files(tmp_path: Path) -> None:
    added = tmp_path / "tokenizer" / "added_tokens.json"
    added.write_text('{"<changed>": 200000}')


def test_a_kept_pass_holds_for_its_tokenizer_files_and_template_only(tmp_path: Path, run_file: Path) -> None:
    from datagen_operator.api import load_run

    spec, out, tokenizer = load_run(run_file).spec, tmp_path / "out", tmp_path / "tokenizer"
    remember_canary(out, canary_basis_here(spec, tokenizer, TEMPLATE), PASSED)
    assert remembered_canary(out, canary_basis_here(spec, tokenizer, TEMPLATE)) is not None
    assert remembered_canary(out, canary_basis_here(spec, tokenizer, SimpleNamespace(chat_template="x"))) is None
    change_tokenizer_files(tmp_path)
    assert remembered_canary(out, canary_basis_here(spec, tokenizer, TEMPLATE)) is None


def test_the_canary_job_reuses_a_kept_pass_and_runs_again_for_changed_tokenizer_files(
    tmp_path: Path, run_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary program as the operator's Job runs it (--output given): the rule `datagen run` follows."""
    from datagen_operator.steps import canary

    sent: list[list[str]] = []

    async def run_canary(spec: Any, tokenizer: Any, dataset: Path, servers: list[str], records: Any) -> StepOutcome:
        sent.append(servers)
        return PASSED

    monkeypatch.setattr(canary, "run_canary", run_canary)
    log = tmp_path / "termination-log"
    argv = ["--run", str(run_file), "--tokenizer", str(tmp_path / "tokenizer"), "--dataset", str(tmp_path / "prompts.jsonl"),
            "--server", "http://srv-0:30000", "--output", str(tmp_path / "out"), "--termination-log", str(log)]  # fmt: skip
    assert canary.main(argv) == 0 and len(sent) == 1
    assert canary.main(argv) == 0 and len(sent) == 1, "the same files: the kept pass, no prompt sent"
    assert StepOutcome.from_storage(log.read_bytes()).message.startswith("passed before with the same fingerprint")
    change_tokenizer_files(tmp_path)
    assert canary.main(argv) == 0 and len(sent) == 2, "changed tokenizer files: the canary runs again"


def _observed(status: DataGenRunStatus, *, suspend: bool, tmp_path: Path, run_file: Path) -> Observed:
    """What the operator's observer reads of a run with no child left but its status."""
    from datagen_operator.api import load_run

    spec = load_run(run_file).spec.model_copy(update={"suspend": suspend})
    cache = RunCache(ctx=SimpleNamespace(children=lambda kind, namespace, run: []), namespace="ml", name="t")  # type: ignore[arg-type]
    observer = Observer(ctx=SimpleNamespace(), cache=cache)  # type: ignore[arg-type]
    return observer._steps(spec, 1, 1, status, READY)


def test_a_run_resumed_before_any_worker_asks_its_canary_job_again(tmp_path: Path, run_file: Path) -> None:
    """Suspended after its canary passed, before a worker started: the tokenizer files may change meanwhile and the
    operator cannot read them, so the resume runs the canary Job (which reuses the kept pass only for the same
    files) instead of the status's verdict, as `datagen run` does on a rerun."""
    passed = Condition(type=CANARY_PASSED, status="True", reason=Reason.PASSED, message="ok",
                       last_transition_time="2026-01-01T00:00:00Z", observed_generation=1)  # fmt: skip
    suspended = DataGenRunStatus(phase=Phase.SUSPENDED, conditions=[passed])
    still = _observed(suspended, suspend=True, tmp_path=tmp_path, run_file=run_file)
    assert still.canary is not None and still.canary.passed, "while suspended the verdict stands"
    resumed = _observed(suspended, suspend=False, tmp_path=tmp_path, run_file=run_file)
    assert resumed.canary is None
    running = DataGenRunStatus(phase=Phase.RUNNING, conditions=[passed])
    assert _observed(running, suspend=False, tmp_path=tmp_path, run_file=run_file).canary is not None

    spec = parse_run(local_run(tmp_path / "tokenizer", tmp_path / "prompts.jsonl", tmp_path / "out")).spec
    observed = Observed(1, preflight=PASS, server=READY, parsers=PASS)
    decision = decide(spec, observed, context(spec))
    assert decision.step == Step.RUN_CANARY
    actions = plan(spec, decision, observed, Children(), 1, urls=["http://srv-0:30000"], server=WantedServer("h", "a"))
    assert Create(Child.CANARY, ("http://srv-0:30000",)) in actions
