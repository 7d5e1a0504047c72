"""The run's CPU Jobs (preflight, canary, workers, verify, export, release) under the real Kueue (docs/kueue.md,
"The run's CPU Jobs"): queued the same way as the server, so
- a run whose LocalQueue has no CPU quota for its Jobs says Progressing=False Queued, naming its queues and what
  is short in Kueue's words, and completes once the quota is there;
- where Kueue manages every Job (a `default` LocalQueue, no spec.queue) the run completes, and a user's suspend
  and resume pause the workers through their Workload's spec.active: the operator writes no spec.suspend to a
  Job Kueue manages, and every prompt is recorded once;
- where Kueue manages every Job and no LocalQueue takes the run's, the run says so, naming spec.queue as the fix;
  setting it does fix it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.k8s import object_meta
from datagen_operator.k8s.kube import Kube
from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.kueue import KUEUE_API_VERSION, gpu_cluster_queue
from tests.harness.kueue_quota import COVERED, run_quota
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, many_prompts, new_name

AMPLE = run_quota(8)
CLIENTS = {"clients.cpu": "100m", "clients.memory": "256Mi"}
"""What each CPU pod of the runs here asks (dotted spec changes): what Kueue admits their Jobs by."""


@pytest.fixture
def suspend_patches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every spec.suspend the in-process operator patches onto a Job, (Job, value), in order."""
    seen: list[tuple[str, Any]] = []
    original = Kube.patch

    async def patch(self: Kube, kind: str, namespace: str, name: str, body: Any) -> None:
        if kind == "Job" and "suspend" in (body.get("spec") or {}):
            seen.append((name, body["spec"]["suspend"]))
        await original(self, kind, namespace, name, body)

    monkeypatch.setattr(Kube, "patch", patch)
    return seen


def workloads(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    return [w.to_dict() for w in cluster.resource(KUEUE_API_VERSION, "Workload").get(namespace=namespace).items]


def kueue_state(cluster: Cluster, runs: Runs) -> str:
    """The Workloads as Kueue left them and the namespace's pods and Jobs, for a failure's message."""
    lines = []
    for w in workloads(cluster, runs.namespace):
        conditions = [
            (c["type"], c["status"], c.get("reason"), c.get("message")) for c in w["status"].get("conditions") or []
        ]
        lines.append(
            f"workload {w['metadata']['name']} queue={w['spec'].get('queueName')} active={w['spec'].get('active')} {conditions}"
        )
    return "\n".join([*lines, runs.describe()])


def wait_condition(
    runs: Runs, cluster: Cluster, run: str, type_: str, status: str, reason: str, timeout: float, words: str = ""
) -> dict[str, Any]:
    return runs.watching(
        run, type_, status, reason, timeout=timeout, words=words, details=lambda: kueue_state(cluster, runs)
    )


def test_a_run_whose_queue_has_no_cpu_quota_for_its_jobs_says_queued_until_it_has(
    kueue_controller: Cluster,
    kueue_namespace: str,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    no_cpu = [{**q, "nominalQuota": "0"} if q["name"] == "cpu" else q for q in AMPLE]
    with (
        gpu_cluster_queue(kueue_controller, kueue_namespace, no_cpu, COVERED, local_queue="team") as (cq, lq),
        start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim,
    ):
        operator([sim.url])
        name = new_name("cpu-quota")
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"queue.name": lq, **CLIENTS}))
        queued = wait_condition(runs, kueue_controller, name, "Progressing", "False", "Queued", 60, "cpu")
        message = queued["message"]
        assert message.startswith(f"the preflight Job is queued by Kueue in LocalQueue {lq} (ClusterQueue {cq}):"), (
            message
        )
        job = runs.job(f"{name}-preflight")
        assert job is not None and job.spec.suspend and job.metadata.labels[object_meta.KUEUE_QUEUE_LABEL] == lq
        assert not kubelet.running(runs.namespace, f"{name}-preflight-"), "a held Job runs no pod"
        # The quota comes: the run goes on by itself.
        flavors = [{"name": f"gpu-{cq.removeprefix('cq-')}", "resources": AMPLE}]
        kueue_controller.resource(KUEUE_API_VERSION, "ClusterQueue").patch(
            name=cq,
            body={"spec": {"resourceGroups": [{"coveredResources": COVERED, "flavors": flavors}]}},
            content_type="application/merge-patch+json",
        )
        wait_condition(runs, kueue_controller, name, "Succeeded", "True", "Completed", 240)
    every_job = runs.batch.list_namespaced_job(runs.namespace, label_selector=f"{object_meta.RUN_LABEL}={name}").items
    assert {j.metadata.labels.get(object_meta.KUEUE_QUEUE_LABEL) for j in every_job} == {lq}, (
        "every Job in the run's queue"
    )


def test_where_kueue_manages_every_job_a_suspend_goes_through_the_workload_and_no_record_is_lost(
    kueue_controller: Cluster,
    kueue_all_jobs_namespace: str,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    suspend_patches: list[tuple[str, Any]],
) -> None:
    prompts = 40
    many_prompts(data_dir, prompts)
    name = new_name("all-jobs")
    workers = f"{name}-workers"
    active: list[bool] = []

    def look() -> None:
        """The workers' Workload's spec.active, each change."""
        job = runs.job(workers)
        if job is None:
            return
        for w in workloads(kueue_controller, runs.namespace):
            if (w["metadata"].get("labels") or {}).get(object_meta.KUEUE_JOB_UID_LABEL) == job.metadata.uid:
                now = w["spec"].get("active", True) is not False
                if not active or active[-1] != now:
                    active.append(now)

    def watching(what: str, check: Any, timeout: float) -> None:
        def seen() -> Any:
            look()
            return check()

        runs.wait_for(what, seen, timeout, details=lambda: kueue_state(kueue_controller, runs))

    records = lambda: ((runs.get(name).get("status") or {}).get("progress") or {}).get("records", 0)  # noqa: E731
    with (
        gpu_cluster_queue(kueue_controller, kueue_all_jobs_namespace, AMPLE, COVERED, local_queue="default"),
        start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim,
    ):
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **CLIENTS))  # no spec.queue
        watching("8 records", lambda: records() >= 8, 180)
        job = runs.job(workers)
        assert job is not None and job.metadata.labels.get(object_meta.KUEUE_QUEUE_LABEL) == "default", (
            "Kueue's default"
        )
        runs.patch_spec(name, {"suspend": True})
        watching(
            "the workers paused by Kueue",
            lambda: (
                active[-1:] == [False]
                and (runs.job(workers) or job).spec.suspend
                and not kubelet.running(runs.namespace, f"{workers}-")
            ),
            60,
        )
        wait_condition(runs, kueue_controller, name, "Progressing", "False", "Suspended", 30)
        paused_at = records()
        runs.patch_spec(name, {"suspend": False})
        watching("the workers resumed", lambda: active[-1:] == [True], 120)
        wait_condition(runs, kueue_controller, name, "Succeeded", "True", "Completed", 240)
        look()
    progress = runs.get(name)["status"]["progress"]
    with (runs.cluster.logs_dir / "kueue-jobs.log").open("a") as log:
        log.write(
            f"{name}: paused at {paused_at}/{prompts} records; workers' Workload spec.active {active}; operator "
            f"spec.suspend patches to Jobs {suspend_patches}; records {progress['records']}\n"
        )
    assert suspend_patches == [], f"the operator patched a managed Job's spec.suspend: {suspend_patches}"
    assert active == [True, False, True], active
    assert progress["records"] == prompts and progress["promptsDone"] == prompts, progress
    assert 8 <= paused_at < prompts, paused_at


def test_where_kueue_manages_every_job_and_no_local_queue_takes_them_the_run_names_spec_queue(
    kueue_controller: Cluster,
    kueue_all_jobs_namespace: str,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    name = new_name("no-queue")
    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **CLIENTS))
        said = wait_condition(runs, kueue_controller, name, "Progressing", "False", "Queued", 60, "spec.queue")
        assert "names no LocalQueue" in said["message"], said["message"]
        started = time.monotonic()
        with gpu_cluster_queue(kueue_controller, kueue_all_jobs_namespace, AMPLE, COVERED, local_queue="team") as (
            _,
            lq,
        ):
            runs.patch_spec(name, {"queue": {"name": lq}})
            wait_condition(runs, kueue_controller, name, "Succeeded", "True", "Completed", 240)
            took = time.monotonic() - started
    every_job = runs.batch.list_namespaced_job(runs.namespace, label_selector=f"{object_meta.RUN_LABEL}={name}").items
    assert {j.metadata.labels.get(object_meta.KUEUE_QUEUE_LABEL) for j in every_job} == {lq}
    with (runs.cluster.logs_dir / "kueue-jobs.log").open("a") as log:
        log.write(f"{name}: completed {took:.0f} s after spec.queue was set\n")
