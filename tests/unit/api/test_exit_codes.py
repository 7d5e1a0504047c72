"""api.exit_codes: the step programs' and the worker's exit codes, named once; the programs exit with the names
and the Jobs' failure policies are written with them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT, EXIT_OK, MEANINGS
from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.control.policy import ShardExit, shard_exit
from datagen_operator.export import run as export
from datagen_operator.k8s import job_manifests, object_meta
from datagen_operator.steps import verify_program
from tests.manifests import unit_spec

RUN = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")
SPEC = parse_spec(unit_spec()).model_copy(update={"export": ExportSpec.model_validate({"formats": ["trl"]})})

STEP_JOBS = {
    "preflight": job_manifests.preflight_job(RUN, SPEC, "img:1", 1),
    "canary": job_manifests.canary_job(RUN, SPEC, "img:1", ["http://a"], 1),
    "verify": job_manifests.verify_job(RUN, SPEC, "img:1"),
    "export": job_manifests.export_job(RUN, SPEC, "img:1"),
    "release-lease": job_manifests.release_job(RUN, SPEC, "img:1", None),
}
"""By program: each step Job with the one failure policy (k8s/job_manifests.py's step Jobs)."""


def container_name(job: object_meta.Manifest) -> str:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return str(container["name"])


@pytest.mark.parametrize("step", STEP_JOBS)
def test_a_step_job_fails_at_once_on_the_exit_of_a_written_verdict(step: str) -> None:
    rules = STEP_JOBS[step]["spec"]["podFailurePolicy"]["rules"]
    (fail,) = [rule for rule in rules if rule["action"] == "FailJob"]
    container = container_name(STEP_JOBS[step])
    assert fail["onExitCodes"] == {"containerName": container, "operator": "In", "values": [EXIT_FAILED_VERDICT]}


@pytest.mark.parametrize("step", STEP_JOBS)
def test_an_evicted_step_pod_spends_no_retry_and_a_crash_is_retried_alike_in_every_step(step: str) -> None:
    # verify and export once had neither: an evicted verify pod spent its only retry.
    spec = STEP_JOBS[step]["spec"]
    # First: the first rule that matches decides, and an evicted pod may exit 1 (the verdict's code) on SIGTERM.
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget"}],
    }
    assert spec["backoffLimit"] == STEP_JOBS["preflight"]["spec"]["backoffLimit"] >= 2


def test_a_failed_verdict_is_no_worker_code_so_a_worker_exiting_1_crashed_and_is_retried() -> None:
    assert EXIT_FAILED_VERDICT not in MEANINGS and {EXIT_OK, EXIT_BAD_INPUT} <= MEANINGS.keys()
    assert shard_exit(EXIT_FAILED_VERDICT, 0) is ShardExit.RETRY


def test_the_step_programs_exit_with_the_named_codes(tmp_path: Path) -> None:
    assert verify_program.main([str(tmp_path / "missing")]) == EXIT_BAD_INPUT
    (tmp_path / "run.yaml").write_text("metadata: {name: halted}\n")
    terminated = tmp_path / "termination-log"
    assert verify_program.main([str(tmp_path), "--termination-log", str(terminated)]) == EXIT_FAILED_VERDICT
    assert orjson.loads(terminated.read_bytes())["passed"] is False  # the verdict is written
    out = tmp_path / "export"
    assert export.main([str(tmp_path), "--formats", "nope", "--out", str(out)]) == EXIT_FAILED_VERDICT


STEP_MODULES = {
    "preflight": "datagen_operator.steps.preflight",
    "canary": "datagen_operator.steps.canary",
    "verify": "datagen_operator.steps.verify_program",
    "export": "datagen_operator.export.run",
    "release-lease": "datagen_operator.output.lease",
}


@pytest.mark.parametrize("step", STEP_JOBS)
def test_a_step_that_crashes_wrote_no_verdict_so_its_job_retries_the_pod(
    step: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash (a volume hiccup, an OOM-killed import) is not the step's verdict: Python would exit 1, the code
    of a written verdict, and its Job would fail at once. The step exits EXIT_STEP_CRASHED instead, which no
    rule of its Job matches, so the Job retries the pod (backoffLimit) before anything is judged."""
    import importlib

    from datagen_operator import cli
    from datagen_operator.api.exit_codes import EXIT_STEP_CRASHED

    def crash(argv: list[str]) -> int:
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr(importlib.import_module(STEP_MODULES[step]), "main", crash)
    assert cli.main([step, "--run", "run.yaml"]) == EXIT_STEP_CRASHED
    assert "Stale file handle" in capsys.readouterr().err, "the traceback is the pod's termination message"
    rules = STEP_JOBS[step]["spec"]["podFailurePolicy"]["rules"]
    assert not any(EXIT_STEP_CRASHED in (rule.get("onExitCodes") or {}).get("values", []) for rule in rules)
    assert STEP_JOBS[step]["spec"]["backoffLimit"] >= 1
    assert EXIT_STEP_CRASHED not in MEANINGS, "no worker code either"


def test_a_worker_crash_is_left_to_its_own_exit_codes() -> None:
    from datagen_operator import cli

    assert "worker" not in cli.STEP_PROGRAMS and set(cli.STEP_PROGRAMS) == set(STEP_JOBS)
