"""The operator with the real Kueue controller (docs/kueue.md): two runs that each need 8 GPUs share a
ClusterQueue of 8. One is admitted and runs; the other says Queued, naming its LocalQueue, its ClusterQueue and
what is short in Kueue's words, holds one gated server pod and nothing more, and runs once the first is done."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from datagen_operator.api.names import Component
from datagen_operator.k8s import object_meta
from tests.harness.controlplane import GPU_RESOURCE, Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.kueue import gpu_cluster_queue, kueue_state
from tests.harness.kueue_quota import COVERED, run_quota
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name


@pytest.fixture
def gpu_queue(kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str]]:
    """(ClusterQueue, LocalQueue): 8 GPUs of quota, CPU and memory to spare."""
    with gpu_cluster_queue(kueue_controller, kueue_namespace, run_quota(8), COVERED) as queues:
        yield queues


def test_two_queued_runs_share_8_gpus_of_quota_one_after_the_other(
    gpu_queue: tuple[str, str],
    kueue_controller: Cluster,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    cluster_queue, local_queue = gpu_queue
    first, second = new_name("first"), new_name("second")
    server_pods: dict[str, set[str]] = {first: set(), second: set()}
    reasons: dict[str, list[str]] = {first: [], second: []}
    created: list[str] = []
    messages: list[str] = []
    """The second run's ServerReady messages, each reason's first, for a failure's message."""

    def look() -> None:
        """Every server pod (by uid) each run ever had, and the run's ServerReady reasons in order."""
        selector = f"{object_meta.COMPONENT_LABEL}={Component.SERVER}"
        for pod in runs.core.list_namespaced_pod(runs.namespace, label_selector=selector).items:
            run = pod.metadata.labels.get(object_meta.RUN_LABEL)
            if run in server_pods:
                server_pods[run].add(pod.metadata.uid)
        for run in created:
            ready = runs.condition(run, "ServerReady")
            if ready and (not reasons[run] or reasons[run][-1] != ready["reason"]):
                reasons[run].append(ready["reason"])
                if run == second:
                    messages.append(f"{ready['reason']}: {ready['message']}")

    def watching(run: str, type_: str, status: str, reason: str, timeout: float, words: str = "") -> dict[str, object]:
        def state() -> str:
            return kueue_state(kueue_controller, runs.namespace, f"{object_meta.COMPONENT_LABEL}={Component.SERVER}")

        return runs.watching(run, type_, status, reason, timeout=timeout, words=words, look=look, details=state)

    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(first, data_dir, standin_tokenizer, **{"queue.name": local_queue}))
        created.append(first)
        watching(first, "ServerReady", "True", "Ready", timeout=120)
        runs.create(cluster_run(second, data_dir, standin_tokenizer, **{"queue.name": local_queue}))
        created.append(second)

        watching(second, "Progressing", "False", "Queued", timeout=90)
        # Kueue's scheduler writes what is short on its next cycle; until then the run says it waits for Kueue.
        queued = watching(second, "Progressing", "False", "Queued", timeout=60, words="8 more needed")
        message = str(queued["message"])
        assert f"LocalQueue {local_queue} (ClusterQueue {cluster_queue})" in message, message
        assert f"insufficient unused quota for {GPU_RESOURCE}" in message, message
        server_ready = runs.condition(second, "ServerReady")
        assert server_ready is not None and server_ready["reason"] == "Queued"

        watching(first, "Succeeded", "True", "Completed", timeout=240)
        watching(second, "ServerReady", "True", "Ready", timeout=300)
        watching(second, "Succeeded", "True", "Completed", timeout=240)

    seen = f"server pods: { {run: len(uids) for run, uids in server_pods.items()} }; reasons: {reasons}\n"
    with (runs.cluster.logs_dir / "kueue-runs.log").open("a") as log:
        log.write(seen)
    assert len(server_pods[first]) == 1 and len(server_pods[second]) == 1, "one server pod each, never another"
    assert "Queued" in reasons[second] and "Unschedulable" not in reasons[second], messages
    assert reasons[second].index("Queued") < reasons[second].index("Ready"), reasons[second]
    assert "Queued" not in reasons[second][reasons[second].index("Ready") :], reasons[second]
