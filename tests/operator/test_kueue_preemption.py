"""The operator with the real Kueue controller (docs/kueue.md, "Preemption and eviction"): a low-priority run holds
the 8 GPUs of a ClusterQueue that preempts LowerPriority and is generating when a high-priority run asks for them.
Kueue preempts the low run's server: the run says Preempted in Kueue's words, naming the run it made room for
(Kueue's own message names it by UIDs only), pauses (its workers wait, no retry,
no restart, no halt), and once the high run is done and its GPUs released Kueue admits the low run again, its
server comes back and the run completes with every record exactly once.

The server pods are kwok's fakes and one simulator answers for them, behind a router (tests/harness/pod_router.py)
that answers for a pod only while it is Ready and not being deleted, as a real pod would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from datagen_operator.api.names import Component
from datagen_operator.k8s import object_meta
from datagen_operator.output.readers import iter_records
from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.kueue import gpu_cluster_queue, kueue_state, workload_priority_classes
from tests.harness.kueue_quota import COVERED, run_quota
from tests.harness.pod_router import PodRouter, ServingPods
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, many_prompts, new_name

SERVER_SELECTOR = f"{object_meta.COMPONENT_LABEL}={Component.SERVER}"
LOW_PROMPTS = 200
HIGH_PROMPTS = 16


@pytest.fixture
def preempting_queue(kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(ClusterQueue, LocalQueue, {"low": class, "high": class}): 8 GPUs, a higher priority preempts a lower."""
    with (
        workload_priority_classes(kueue_controller, kueue_namespace) as classes,
        gpu_cluster_queue(
            kueue_controller,
            kueue_namespace,
            run_quota(8),
            COVERED,
            preemption={"withinClusterQueue": "LowerPriority"},
        ) as (cluster_queue, local_queue),
    ):
        yield cluster_queue, local_queue, classes


def test_a_preempted_run_pauses_and_completes_every_record_once_after_readmission(
    preempting_queue: tuple[str, str, dict[str, str]],
    kueue_controller: Cluster,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    cluster_queue, local_queue, classes = preempting_queue
    many_prompts(data_dir, LOW_PROMPTS)
    few = data_dir / "few.jsonl"
    few.write_text(
        "".join(
            json.dumps({"id": f"h{i:03d}", "messages": [{"role": "user", "content": f"High {i}?"}]}) + "\n"
            for i in range(HIGH_PROMPTS)
        )
    )
    low, high = new_name("low"), new_name("high")
    server_pods: dict[str, set[str]] = {low: set(), high: set()}
    restarts: dict[str, int] = {low: 0, high: 0}
    reasons: dict[str, list[str]] = {low: [], high: []}
    progressing: list[str] = []
    """The low run's Progressing reasons in order."""
    messages: list[str] = []
    """The low run's ServerReady messages, each reason's first."""
    workers_failed = [0]
    created: list[str] = []

    def look() -> None:
        for pod in runs.core.list_namespaced_pod(runs.namespace, label_selector=SERVER_SELECTOR).items:
            run = pod.metadata.labels.get(object_meta.RUN_LABEL)
            if run in server_pods:
                server_pods[run].add(pod.metadata.uid)
                for status in pod.status.container_statuses or []:
                    restarts[run] = max(restarts[run], status.restart_count or 0)
        for run in created:
            ready = runs.condition(run, "ServerReady")
            if ready and (not reasons[run] or reasons[run][-1] != ready["reason"]):
                reasons[run].append(ready["reason"])
                if run == low:
                    messages.append(f"{ready['reason']}: {ready['message']}")
        state = runs.condition(low, "Progressing")
        if state and (not progressing or progressing[-1] != state["reason"]):
            progressing.append(state["reason"])
        workers = runs.job(f"{low}-workers")
        if workers is not None:
            workers_failed[0] = max(workers_failed[0], workers.status.failed or 0)

    def watching(run: str, type_: str, status: str, reason: str, timeout: float, words: str = "") -> dict[str, object]:
        def seen() -> str:
            state = kueue_state(kueue_controller, runs.namespace, SERVER_SELECTOR)
            return f"reasons {reasons}\nprogressing {progressing}\nmessages {messages}\n{state}"

        return runs.watching(run, type_, status, reason, timeout=timeout, words=words, look=look, details=seen)

    def records(run: str) -> int:
        return int(((runs.get(run).get("status") or {}).get("progress") or {}).get("records") or 0)

    with (
        start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim,
        ServingPods(kueue_controller, SERVER_SELECTOR) as pods,
        PodRouter(pods.to(sim.url)) as router,
    ):
        operator([router.endpoint_template])
        runs.create(
            cluster_run(
                low,
                data_dir,
                standin_tokenizer,
                **{
                    "queue.name": local_queue,
                    "queue.workloadPriorityClassName": classes["low"],
                    "clients.shards": 2,
                    "clients.concurrency": 8,
                },
            )
        )
        created.append(low)
        watching(low, "Progressing", "True", "Running", timeout=180)
        runs.wait_for(f"{low} mid-run", lambda: (look(), 20 <= records(low) < LOW_PROMPTS // 2)[1], timeout=120)
        before = records(low)

        runs.create(
            cluster_run(
                high,
                data_dir,
                standin_tokenizer,
                **{
                    "queue.name": local_queue,
                    "queue.workloadPriorityClassName": classes["high"],
                    "dataset.path": few.name,
                },
            )
        )
        created.append(high)
        preempted = watching(low, "ServerReady", "False", "Preempted", timeout=120)
        message = str(preempted["message"])
        assert f"LocalQueue {local_queue} (ClusterQueue {cluster_queue})" in message, message
        assert "Preempted to accommodate a workload" in message and "waiting for re-admission" in message, message
        # Kueue names the preemptor by UIDs only: the run it made room for is named, as kubectl names it.
        assert f"to make room for DataGenRun {runs.namespace}/{high}: " in message, message
        paused = watching(low, "Progressing", "False", "Preempted", timeout=30)
        assert str(paused["message"]).startswith("workers wait for the server: preempted by Kueue"), paused
        assert runs.condition(low, "Succeeded")["reason"] == "Running"  # type: ignore[index]

        watching(high, "Succeeded", "True", "Completed", timeout=240)
        watching(low, "ServerReady", "True", "Ready", timeout=240)
        watching(low, "Succeeded", "True", "Completed", timeout=300)
        events = [e for e in runs.events(low) if e.reason == "ServerReadyPreempted"]
        look()

    ids = [record["id"] for record in iter_records(data_dir / "out" / low)]
    seen = (
        f"low: server pods {len(server_pods[low])}, restarts {restarts[low]}, workers failed {workers_failed[0]}, "
        f"records before preemption {before}, ids {len(ids)} ({len(set(ids))} unique); reasons {reasons[low]}; "
        f"progressing {progressing}; high: server pods {len(server_pods[high])}, reasons {reasons[high]}; "
        f"router forwarded {sum(router.forwarded.values())}, refused {dict(router.refused)}, cut {dict(router.cut)}\n"
    )
    with (runs.cluster.logs_dir / "kueue-runs.log").open("a") as log:
        log.write(seen)
    assert reasons[low][0] != "Preempted" and "Ready" in reasons[low], seen
    first_ready = reasons[low].index("Ready")
    assert "Preempted" in reasons[low][first_ready:], seen
    after = reasons[low][reasons[low].index("Preempted", first_ready) :]
    assert "Ready" in after[1:], seen
    assert not {"CrashLoop", "StartupTimeout", "Unschedulable"} & set(reasons[low]), seen
    assert not set(after[1 : after.index("Ready", 1)]) - {"Preempted", "Queued", "Pending", "Loading", "Creating"}, seen
    assert "Preempted" in progressing and progressing[-1] == "Completed", seen
    assert len(server_pods[low]) == 2, f"the first server pod and the one made again after re-admission: {seen}"
    assert restarts[low] == 0 and workers_failed[0] == 0, f"no restart, no retry spent: {seen}"
    assert len(ids) == LOW_PROMPTS and len(set(ids)) == LOW_PROMPTS, f"every record exactly once: {seen}"
    assert events and all(e.type == "Normal" for e in events), [(e.type, e.message) for e in events]
    assert all(f"DataGenRun {runs.namespace}/{high}" in e.message for e in events), [e.message for e in events]
    low_pod = (runs.namespace, f"{low}-server-0")
    assert router.refused[low_pod] + router.cut[low_pod] > 0, f"the preempted run's workers lost their server: {seen}"
    assert len(server_pods[high]) == 1 and reasons[high][-1] in ("Released", "Ready"), seen
