"""A verdict, once observed, is recorded: Kubernetes deletes finished pods whenever it likes (users, pod GC,
namespace deletion), and a step whose pod is gone has not failed. Deleting the preflight's and the canary's
finished pods during bulk generation changes no condition, re-creates no step and the run still succeeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name

RECORDED = ("InputsVerified", "CanaryPassed", "ParsersVerified")


def recorded(runs: Runs, name: str) -> dict[str, tuple[Any, ...]]:
    conditions = runs.get(name)["status"]["conditions"]
    return {
        c["type"]: (c["status"], c["reason"], c.get("lastTransitionTime")) for c in conditions if c["type"] in RECORDED
    }


def finished_pods(runs: Runs, component: str) -> list[Any]:
    selector = f"datagen.dev/component={component}"
    return runs.core.list_namespaced_pod(runs.namespace, label_selector=selector).items


def test_deleted_finished_pods_change_no_verdict(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("gc")
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "CanaryPassed", "True", "Passed", timeout=120)
        runs.wait(name, "Progressing", "True", "Running", timeout=60)
        before = recorded(runs, name)
        assert [status for status, _, _ in before.values()] == ["True"] * len(RECORDED), before
        jobs = {j.metadata.name: j.metadata.uid for j in runs.batch.list_namespaced_job(runs.namespace).items}

        deleted = 0
        for component in ("preflight", "canary"):
            for pod in finished_pods(runs, component):
                runs.core.delete_namespaced_pod(pod.metadata.name, runs.namespace)
                deleted += 1
        assert deleted >= 2, "the preflight and canary pods were there to delete"
        runs.wait_for(
            "the finished pods gone", lambda: not finished_pods(runs, "preflight") + finished_pods(runs, "canary")
        )

        # Every pass until the end sees the same verdicts: none re-derived from a pod that is gone.
        seen: list[dict[str, tuple[Any, ...]]] = []

        def succeeded() -> bool:
            seen.append(recorded(runs, name))
            condition = runs.condition(name, "Succeeded") or {}
            return condition.get("status") in ("True", "False")

        runs.wait_for("the run to end", succeeded, timeout=180)
        final = runs.condition(name, "Succeeded")
    assert final is not None and (final["status"], final["reason"]) == ("True", "Completed"), final
    changed = [snapshot for snapshot in seen if snapshot != before]
    assert not changed, f"{len(changed)}/{len(seen)} polls saw a recorded verdict change: {changed[:1]} vs {before}"
    after = {j.metadata.name: j.metadata.uid for j in runs.batch.list_namespaced_job(runs.namespace).items}
    assert {k: v for k, v in after.items() if k in jobs} == jobs, "no step Job was re-created"
    assert not finished_pods(runs, "preflight") and not finished_pods(runs, "canary"), "no step ran again"
    assert runs.get(name)["status"]["progress"]["promptsDone"] == 24
