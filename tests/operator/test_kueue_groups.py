"""Servers Kueue admits that the run does not name a queue for, or that span nodes, under the real Kueue
(docs/kueue.md). A run with server.nodes=2 (one LeaderWorkerSet group of two 8-GPU pods) behind a ClusterQueue
of 8 GPUs: its leader alone would fit, yet Kueue admits the group whole or not at all; the run says Queued in
Kueue's words and no pod of it holds a node; raising the quota to 16 admits the whole group at once, and the run
completes on the same group: two server pods, ever. A run without spec.queue in a namespace whose LocalQueue
`default` Kueue puts on it reads Queued too (it read Unschedulable, the gated pods' words)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.controlplane import GPU_RESOURCE, Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.kueue import KUEUE_API_VERSION, gpu_cluster_queue
from tests.harness.kueue_quota import COVERED, run_quota, set_gpu_quota
from tests.harness.lws import LWS_NAME_LABEL
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name

ADMISSION_GATE = "kueue.x-k8s.io/admission"


@pytest.fixture
def eight_gpus(lws_controller: Cluster, kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str]]:
    """(ClusterQueue, LocalQueue): 8 GPUs of quota, half of what one two-node group asks."""
    with gpu_cluster_queue(kueue_controller, kueue_namespace, run_quota(8), COVERED) as queues:
        yield queues


def test_a_two_node_server_is_queued_whole_and_admitted_whole(
    eight_gpus: tuple[str, str],
    kueue_controller: Cluster,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    cluster_queue, local_queue = eight_gpus
    name = new_name("group")
    pods_seen: dict[str, str | None] = {}
    """Every pod of the group ever seen (uid -> the node it was ever bound to)."""
    reasons: list[str] = []
    """The run's ServerReady reasons in order."""

    def look() -> None:
        selector = f"{LWS_NAME_LABEL}={name}-server"
        for pod in runs.core.list_namespaced_pod(runs.namespace, label_selector=selector).items:
            pods_seen[pod.metadata.uid] = pods_seen.get(pod.metadata.uid) or pod.spec.node_name
        ready = runs.condition(name, "ServerReady")
        if ready and (not reasons or reasons[-1] != ready["reason"]):
            reasons.append(ready["reason"])

    def watching(type_: str, status: str, reason: str, timeout: float, words: str = "") -> dict[str, object]:
        return runs.watching(name, type_, status, reason, timeout=timeout, words=words, look=look)

    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"server.nodes": 2, "queue.name": local_queue}))

        # Kueue's scheduler writes what is short on its next cycle; until then the run says it waits for Kueue.
        queued = watching("Progressing", "False", "Queued", timeout=120, words=f"insufficient quota for {GPU_RESOURCE}")
        message = str(queued["message"])
        assert f"LocalQueue {local_queue} (ClusterQueue {cluster_queue})" in message, message
        assert runs.get(name)["status"]["phase"] == "Queued"
        held = runs.core.list_namespaced_pod(runs.namespace, label_selector=f"{LWS_NAME_LABEL}={name}-server").items
        assert held, "the group's leader pod exists, gated"
        for pod in held:  # the leader would fit 8 GPUs alone: held all the same, on no node
            assert ADMISSION_GATE in [gate.name for gate in pod.spec.scheduling_gates or []], pod.spec
            assert not pod.spec.node_name
        every = kueue_controller.resource(KUEUE_API_VERSION, "Workload").get(namespace=runs.namespace).items
        # The server's (the run's Jobs are queued too, each a Workload of its own: docs/kueue.md).
        workloads = [w for w in every if any(o.kind == "LeaderWorkerSet" for o in w.metadata.ownerReferences or [])]
        assert len(workloads) == 1, "one Workload for the whole group"
        assert {(s.name, s.count) for s in workloads[0].spec.podSets} == {("leader", 1), ("worker", 1)}

        set_gpu_quota(kueue_controller, cluster_queue, 16)

        watching("ServerReady", "True", "Ready", timeout=120)
        watching("Succeeded", "True", "Completed", timeout=240)
        look()

    nodes = [node for node in pods_seen.values() if node]
    assert len(pods_seen) == 2, f"the group's leader and worker, never another pod: {pods_seen}"
    assert len(nodes) == len(set(nodes)) == 2, f"both placed, one per node: {pods_seen}"
    assert reasons.index("Queued") < reasons.index("Ready"), reasons
    assert "Unschedulable" not in reasons, reasons
    assert runs.get(name)["status"]["progress"]["promptsDone"] == 24


@pytest.fixture
def default_queue_without_gpus(kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str]]:
    """(ClusterQueue, LocalQueue `default`): Kueue's per-namespace default, with no GPU quota yet."""
    with gpu_cluster_queue(kueue_controller, kueue_namespace, run_quota(0), COVERED, local_queue="default") as queues:
        yield queues


def test_a_run_without_spec_queue_under_the_namespaces_default_local_queue_reads_queued(
    default_queue_without_gpus: tuple[str, str],
    kueue_controller: Cluster,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    """Kueue's webhook puts the `default` LocalQueue's label on the server of a run that names no queue, and holds
    it: the run says so (not Unschedulable, the gated pods' words), and runs once the quota is there."""
    cluster_queue, local_queue = default_queue_without_gpus
    name = new_name("default")
    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        queued = runs.wait(name, "ServerReady", "False", "Queued", timeout=120)
        assert f"LocalQueue {local_queue} (ClusterQueue {cluster_queue})" in queued["message"], queued
        server = runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace)
        assert server.metadata.labels["kueue.x-k8s.io/queue-name"] == "default"  # Kueue's, not the operator's

        set_gpu_quota(kueue_controller, cluster_queue, 8)
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
