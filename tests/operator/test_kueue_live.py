"""Changing a queued run where Kueue admits its server, with the real Kueue controller (docs/kueue.md): Kueue
refuses to change a managed server's placement, requests or queue in place, so the operator makes the server
anew; the run moves from a queue with no GPUs to one with room, and completes. Counted: the server
StatefulSets made (by uid), the server pods that held a node, and whether the API server ever refused a write
of the server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from datagen_operator.api.names import Component, server_name
from datagen_operator.k8s import object_meta
from tests.harness.controlplane import GPU_PRODUCT, Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.kueue import gpu_cluster_queue
from tests.harness.kueue_quota import COVERED, run_quota
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name


@pytest.fixture
def two_queues(kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str]]:
    """(LocalQueue with no GPU quota, LocalQueue with 8 GPUs)."""
    with contextlib.ExitStack() as stack:
        _, empty = stack.enter_context(
            gpu_cluster_queue(kueue_controller, kueue_namespace, run_quota(0), COVERED, local_queue="no-gpus")
        )
        _, room = stack.enter_context(
            gpu_cluster_queue(kueue_controller, kueue_namespace, run_quota(8), COVERED, local_queue="gpus")
        )
        yield empty, room


def test_a_queued_run_takes_new_placement_and_a_new_queue_by_a_new_server_and_completes(
    two_queues: tuple[str, str],
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    empty, room = two_queues
    name = new_name("moved")
    statefulsets: dict[str, dict[str, object]] = {}
    """uid -> (queue label, nodeSelector) of every server StatefulSet the run had."""
    bound_pods: set[str] = set()
    refusals: list[str] = []

    def look() -> None:
        sts = runs.apps.list_namespaced_stateful_set(
            runs.namespace, field_selector=f"metadata.name={server_name(name)}"
        )
        for item in sts.items:
            statefulsets[item.metadata.uid] = {
                "queue": (item.metadata.labels or {}).get(object_meta.KUEUE_QUEUE_LABEL),
                "nodeSelector": item.spec.template.spec.node_selector,
            }
        selector = f"{object_meta.COMPONENT_LABEL}={Component.SERVER},{object_meta.RUN_LABEL}={name}"
        for pod in runs.core.list_namespaced_pod(runs.namespace, label_selector=selector).items:
            if pod.spec.node_name:
                bound_pods.add(pod.metadata.uid)
        accepted = runs.condition(name, "ChildrenAccepted")
        if accepted and accepted["status"] == "False" and accepted["message"] not in refusals:
            refusals.append(accepted["message"])

    def wait(type_: str, status: str, reason: str, words: str = "", timeout: float = 120) -> None:
        def seen() -> str:
            return f"refusals {refusals}; statefulsets {statefulsets}"

        runs.watching(name, type_, status, reason, timeout=timeout, words=words, look=look, details=seen)

    def made_anew(count: int) -> None:
        runs.wait_for(f"{count} server StatefulSets made", lambda: look() or len(statefulsets) >= count, timeout=120)

    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"queue.name": empty}))
        wait("Progressing", "False", "Queued", words=f"LocalQueue {empty}")
        made_anew(1)

        # Placement, while queued: Kueue refuses a managed set's nodeSelector change, so the server is made anew.
        placement = {"nvidia.com/gpu.product": GPU_PRODUCT}
        runs.patch_spec(name, {"server": {"nodeSelector": placement}})
        made_anew(2)
        wait("Progressing", "False", "Queued", words=f"LocalQueue {empty}")

        # A queue with room: the server is made anew there (Kueue moves a StatefulSet to another queue only while
        # none of its pods is ready, a LeaderWorkerSet never), and runs.
        runs.patch_spec(name, {"queue": {"name": room}})
        wait("ServerReady", "True", "Ready", timeout=180)
        wait("Succeeded", "True", "Completed", timeout=240)

    look()
    made = list(statefulsets.values())
    assert len(made) == 3, made
    assert made[1]["nodeSelector"] == placement and made[2]["queue"] == room, made
    assert [s["queue"] for s in made] == [empty, empty, room], made
    assert len(bound_pods) == 1, "only the server in the queue with room ever held a node"
    # About the server only: Kueue's pod webhook may refuse a step Job's first pod while its cache lacks the
    # Job just made ("Job.batch ... not found"); the Job controller retries, and that is no write of ours.
    server_refusals = [r for r in refusals if "StatefulSet/" in r or f"{object_meta.LWS_KIND}/" in r]
    assert server_refusals == [], "the API server (Kueue's webhook) never refused a write of the server"
