"""An evicted step pod spends no retry, in every step (issue 33 item 5). Each step's pod is evicted through the
Eviction API before it starts (the test kubelet holds it Pending); the API server marks it DisruptionTarget, the
Job controller ignores the failure (the Job's `status.failed` stays 0: a failure it counts toward backoffLimit is
counted there) and makes another pod, after its pod re-creation back-off (10 s). Before, verify and export had no
such rule (an evicted verify pod spent its only retry), and a step whose program exited 1 on its SIGTERM would
have read as a written verdict (the FailJob rule came first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name

STEPS = ("preflight", "canary", "verify", "export")
EVICTIONS = 1
"""Per step: each costs the Job controller's re-creation back-off (10 s, then 20 s, 40 s...)."""


def test_evicting_each_steps_pod_spends_no_retry(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("evict")
    kubelet.held.update(STEPS)
    evicted: dict[str, list[str]] = {step: [] for step in STEPS}

    def pending_pod(step: str) -> Any:
        pods = runs.core.list_namespaced_pod(runs.namespace, label_selector=f"job-name={name}-{step}").items
        fresh = [p for p in pods if p.metadata.deletion_timestamp is None and p.metadata.name not in evicted[step]]
        return fresh[0] if fresh else None

    def evict(pod: Any) -> None:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=runs.namespace))
        runs.core.create_namespaced_pod_eviction(pod.metadata.name, runs.namespace, body)

    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"export.formats": ["speculators"]}))
        for step in STEPS:
            for _ in range(EVICTIONS):
                pod = runs.wait_for(f"a {step} pod to evict", lambda step=step: pending_pod(step), timeout=240)
                evict(pod)
                evicted[step].append(pod.metadata.name)
            replacement = runs.wait_for(f"the {step} pod after the evictions", lambda step=step: pending_pod(step))
            kubelet.held.discard(step)
            job = runs.job(f"{name}-{step}")
            assert not [c.type for c in job.status.conditions or [] if c.type == "Failed"], (step, job.status)
            assert replacement.metadata.name not in evicted[step]
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)

    for step in STEPS:
        # The run reads a verdict from its pod's termination message: the Job controller may count it a moment later.
        job = runs.wait_for(f"the {step} Job complete", lambda step=step: _complete(runs.job(f"{name}-{step}")))
        created = sum(e.count or 1 for e in runs.events(f"{name}-{step}") if e.reason == "SuccessfulCreate")
        assert created == EVICTIONS + 1, (step, created)
        assert (job.status.succeeded, job.status.failed or 0) == (1, 0), (step, job.status)


def _complete(job: Any) -> Any:
    return job if job is not None and job.status.succeeded else None
