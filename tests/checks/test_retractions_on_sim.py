"""Issue 32 item 1 end to end: a worker against a simulator that retracts every request stores
meta_info.num_retractions per record; with a penalty set, every record is flagged `retracted` (in the worker's
counters and again by verify from the stored column) and the retractions check fails naming memory; without
one, the same retractions are stored and harmless."""

from __future__ import annotations

from pathlib import Path

import pytest

from datagen_operator.api import load_run
from datagen_operator.api.flags import RETRACTED
from datagen_operator.api.progress import ShardProgress
from datagen_operator.checks.evaluate import RETRACTIONS
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import local_run, write_run
from tests.programs import one_shard_worker, run_program

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts" / "quickstart.jsonl"
SIM = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "40")


@pytest.mark.parametrize("penalty", [0.5, None])
def test_retracted_records_are_flagged_where_the_penalties_restart(tmp_path: Path, penalty: float | None) -> None:
    standin = ensure_standin_tokenizer()
    sampling: dict = {"max_new_tokens": 4096, **({"frequency_penalty": penalty} if penalty else {})}
    run_file = tmp_path / "run.yaml"
    changes = {"generation": {"sampling": sampling}, "clients": {"shards": 1, "concurrency": 8}}
    write_run(run_file, local_run(standin, PROMPTS, tmp_path / "out", name="r", **changes))
    with start_sim(*SIM, "--sim-retraction-rate", "1") as sim:
        worker = run_program(one_shard_worker(run_file, tmp_path / "out", sim.url))
    assert worker.returncode == 0, worker.stdout + worker.stderr
    stored = list(iter_records(tmp_path / "out"))
    assert len(stored) == 24 and all(r["num_retractions"] == 1 for r in stored)
    flagged = sum(RETRACTED in r["flags"] for r in stored)
    progress = ShardProgress.from_storage((tmp_path / "out" / "shards" / "00000" / "progress.json").read_bytes())
    assert progress.counts.flags.get(RETRACTED, 0) == flagged
    spec = load_run(run_file).spec
    report = verify_output(
        tmp_path / "out", spec, tokenizer=load_tokenizer(spec.model.path, trust_remote_code=False), dataset=PROMPTS
    )
    check = next(c for c in report.checks if c.name == RETRACTIONS)
    if penalty:
        assert flagged == 24 and (check.passed, check.count) == (False, 24)
        assert "penalties and min_new_tokens started again from zero" in check.verdict
        assert "server.memFractionStatic" in check.verdict
    else:
        assert flagged == 0 and check.passed and check.count == 0
        assert report.passed, [c.verdict for c in report.checks if not c.passed]
