"""The real Kueue controller in the test control plane: a StatefulSet labelled with a LocalQueue is one
Kueue Workload (a pod group), its pods held by Kueue's scheduling gate until the Workload is admitted
against the ClusterQueue's quota. What the operator relies on is in docs/kueue.md."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from datagen_operator.k8s.object_facts import kueue_queued
from tests.cluster.test_lws import leaderworkerset
from tests.harness.controlplane import GPU_RESOURCE, GPU_TOLERATION, Cluster
from tests.harness.kueue import KUEUE_API_VERSION, gpu_cluster_queue
from tests.harness.kueue_quota import set_gpu_quota
from tests.harness.lws import LWS_API_VERSION, LWS_NAME_LABEL
from tests.harness.processes import wait_until

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ADMISSION_GATE = "kueue.x-k8s.io/admission"


def gpu_statefulset(name: str, *, queue: str | None, gpus: int) -> dict[str, Any]:
    container = {
        "name": "server",
        "image": "lmsysorg/sglang:v0.5.23",
        "resources": {
            "requests": {"cpu": "8", "memory": "64Gi", GPU_RESOURCE: str(gpus)},
            "limits": {GPU_RESOURCE: str(gpus)},
        },
    }
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue} if queue else {}},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"tolerations": [GPU_TOLERATION], "containers": [container]},
            },
        },
    }


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found["type"] == kind:
            return dict(found)
    return None


@pytest.fixture
def gpu_queue(kueue_controller: Cluster, kueue_namespace: str) -> Iterator[tuple[str, str]]:
    """(ClusterQueue, LocalQueue): one 8-GPU flavor's quota (plus CPU and memory) behind a LocalQueue
    in the test's namespace; the cluster-scoped objects are removed afterwards."""
    quota = [
        {"name": "cpu", "nominalQuota": "64"},
        {"name": "memory", "nominalQuota": "512Gi"},
        {"name": GPU_RESOURCE, "nominalQuota": "8"},
    ]
    with gpu_cluster_queue(kueue_controller, kueue_namespace, quota, ["cpu", "memory", GPU_RESOURCE]) as queues:
        yield queues


def test_two_8_gpu_statefulsets_share_an_8_gpu_quota_one_at_a_time(
    kueue_controller: Cluster, kueue_namespace: str, gpu_queue: tuple[str, str]
) -> None:
    cluster_queue, local_queue = gpu_queue
    namespace = kueue_namespace
    sets = kueue_controller.resource("apps/v1", "StatefulSet")
    pods = kueue_controller.resource("v1", "Pod")
    workloads = kueue_controller.resource(KUEUE_API_VERSION, "Workload")

    def workload_of(name: str) -> dict[str, Any] | None:
        for workload in workloads.get(namespace=namespace).to_dict()["items"]:
            owners = workload["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "StatefulSet" and o["name"] == name for o in owners):
                return dict(workload)
        return None

    def pod_of(name: str) -> dict[str, Any] | None:
        found = pods.get(namespace=namespace, label_selector=f"app={name}").to_dict()["items"]
        return dict(found[0]) if found else None

    def admitted_and_placed(name: str) -> dict[str, Any] | None:
        workload, pod = workload_of(name), pod_of(name)
        if workload is None or pod is None:
            return None
        if (condition(workload, "Admitted") or {}).get("status") != "True" or not pod["spec"].get("nodeName"):
            return None
        return pod

    sets.create(namespace=namespace, body=gpu_statefulset("first", queue=local_queue, gpus=8))
    first_pod = wait_until(
        lambda: admitted_and_placed("first"), timeout=60, describe="the first set admitted, its pod placed"
    )
    assert not first_pod["spec"].get("schedulingGates"), "Kueue lifts its gate on admission"
    first = workload_of("first")
    assert first is not None
    assert first["spec"]["queueName"] == local_queue
    assert first["status"]["admission"]["clusterQueue"] == cluster_queue
    assert [p["count"] for p in first["spec"]["podSets"]] == [1]  # the whole set, one unit

    sets.create(namespace=namespace, body=gpu_statefulset("second", queue=local_queue, gpus=8))

    def pending() -> dict[str, Any] | None:
        workload = workload_of("second")
        reserved = condition(workload, "QuotaReserved") if workload else None
        return reserved if reserved and reserved["status"] == "False" and reserved["reason"] == "Pending" else None

    reserved = wait_until(pending, timeout=60, describe="the second set's Workload Pending")
    # Kueue's own words (pkg/scheduler/flavorassigner): what is short, in which flavor, by how much.
    assert f"insufficient unused quota for {GPU_RESOURCE} in flavor gpu-" in reserved["message"]
    assert "8 more needed" in reserved["message"]
    second = workload_of("second")
    assert second is not None and (condition(second, "Admitted") or {}).get("status") != "True"
    # The operator's reading of these very objects (k8s/object_facts.py), Queued in Kueue's words.
    queued = kueue_queued(second, cluster_queue)
    assert queued is not None
    assert (queued.local_queue, queued.cluster_queue, queued.kueue_reason) == (local_queue, cluster_queue, "Pending")
    assert queued.message == reserved["message"]
    assert kueue_queued(first) is None
    second_pod = wait_until(lambda: pod_of("second"), timeout=30, describe="the second set's pod created")
    gates = [g["name"] for g in second_pod["spec"].get("schedulingGates") or []]
    assert ADMISSION_GATE in gates, f"the pod waits on Kueue's gate: {gates}"
    assert not second_pod["spec"].get("nodeName")

    sets.delete(namespace=namespace, name="first")
    wait_until(
        lambda: admitted_and_placed("second"), timeout=90, describe="the second set admitted once the first is gone"
    )
    sets.delete(namespace=namespace, name="second")


def test_kueue_leaves_an_unlabelled_namespace_alone(kueue_controller: Cluster, namespace: str) -> None:
    """The other tests of a session that started Kueue: their StatefulSets meet no Kueue webhook and get no
    Workload; the pod is placed as without Kueue. (A set that names a queue would still get a Workload from
    Kueue's controller in any namespace: only the webhooks are confined, docs/kueue.md.)"""
    sets = kueue_controller.resource("apps/v1", "StatefulSet")
    pods = kueue_controller.resource("v1", "Pod")
    sets.create(namespace=namespace, body=gpu_statefulset("plain", queue=None, gpus=8))

    def placed() -> dict[str, Any] | None:
        found = pods.get(namespace=namespace, label_selector="app=plain").to_dict()["items"]
        return dict(found[0]) if found and found[0]["spec"].get("nodeName") else None

    pod = wait_until(placed, timeout=60, describe="the unmanaged set's pod placed")
    assert not pod["spec"].get("schedulingGates")
    assert "kueue.x-k8s.io/pod-suspending-parent" not in (pod["metadata"].get("annotations") or {})
    assert not kueue_controller.resource(KUEUE_API_VERSION, "Workload").get(namespace=namespace).to_dict()["items"]
    sets.delete(namespace=namespace, name="plain")


def test_the_operators_queued_server_is_one_workload_admitted_whole(
    kueue_controller: Cluster, kueue_namespace: str, gpu_queue: tuple[str, str]
) -> None:
    """k8s/server_manifests.py's StatefulSet for a run with spec.queue, as the operator would create it (less the
    owner): Kueue's webhooks accept it, one Workload holds both replicas, admitted or not as one."""
    from datagen_operator.api import parse_run
    from datagen_operator.k8s import object_meta, server_manifests
    from tests.manifests import example_run

    cluster_queue, local_queue = gpu_queue
    document = example_run(
        **{
            "spec.server.gpus": 4,
            "spec.server.tensorParallel": 4,
            "spec.server.tolerations": [GPU_TOLERATION],
            "spec.queue.name": local_queue,
        }
    )
    spec = parse_run(document).spec
    body = server_manifests.server_statefulset(object_meta.RunRef("kimi", kueue_namespace, "no-owner"), spec, 2)
    del body["metadata"]["ownerReferences"]  # no DataGenRun here: the garbage collector would take it
    kueue_controller.resource("apps/v1", "StatefulSet").create(namespace=kueue_namespace, body=body)
    workloads = kueue_controller.resource(KUEUE_API_VERSION, "Workload")
    pods = kueue_controller.resource("v1", "Pod")

    def admitted() -> dict[str, Any] | None:
        for workload in workloads.get(namespace=kueue_namespace).to_dict()["items"]:
            if (condition(workload, "Admitted") or {}).get("status") == "True":
                return dict(workload)
        return None

    workload = wait_until(admitted, timeout=60, describe="the server's Workload admitted")
    assert len(workloads.get(namespace=kueue_namespace).to_dict()["items"]) == 1
    assert workload["spec"]["queueName"] == local_queue
    assert workload["status"]["admission"]["clusterQueue"] == cluster_queue
    (pod_set,) = workload["spec"]["podSets"]
    assert pod_set["count"] == 2  # both data-parallel replicas, 2 x 4 GPUs of the 8
    assert kueue_queued(workload) is None

    def both_released() -> list[dict[str, Any]] | None:
        # Released to the scheduler (Kueue's gate lifted); not placed: the example's model claim is not here.
        found = pods.get(namespace=kueue_namespace, label_selector=f"{object_meta.RUN_LABEL}=kimi").to_dict()["items"]
        return found if len(found) == 2 and not any(p["spec"].get("schedulingGates") for p in found) else None

    for pod in wait_until(both_released, timeout=60, describe="both server pods released by Kueue"):
        assert pod["metadata"]["labels"][QUEUE_LABEL] == local_queue  # Kueue's copy; not in our template
    assert QUEUE_LABEL not in body["spec"]["template"]["metadata"]["labels"]
    kueue_controller.resource("apps/v1", "StatefulSet").delete(namespace=kueue_namespace, name=body["metadata"]["name"])


def test_a_leaderworkerset_group_is_admitted_whole_or_not_at_all(
    kueue_controller: Cluster, kueue_namespace: str, gpu_queue: tuple[str, str]
) -> None:
    """A two-node group (2 x 8 GPUs) against 8 GPUs of quota: the leader alone would fit, yet no pod of the
    group is released until the whole group fits; raising the quota to 16 releases both at once."""
    cluster_queue, local_queue = gpu_queue
    body = leaderworkerset("sglang", size=2, gpus=8)
    body["metadata"]["labels"] = {QUEUE_LABEL: local_queue}
    # A leader template of its own, as the operator's group has (k8s/server_manifests.py): Kueue's pod sets follow it.
    group = body["spec"]["leaderWorkerTemplate"]
    group["leaderTemplate"] = copy.deepcopy(group["workerTemplate"])
    kueue_controller.resource(LWS_API_VERSION, "LeaderWorkerSet").create(namespace=kueue_namespace, body=body)
    workloads = kueue_controller.resource(KUEUE_API_VERSION, "Workload")
    pods = kueue_controller.resource("v1", "Pod")

    def group_workload() -> dict[str, Any] | None:
        found = workloads.get(namespace=kueue_namespace).to_dict()["items"]
        return dict(found[0]) if len(found) == 1 else None

    def pending() -> dict[str, Any] | None:
        workload = group_workload()
        reserved = condition(workload, "QuotaReserved") if workload else None
        return workload if reserved and reserved["status"] == "False" and reserved["reason"] == "Pending" else None

    workload = wait_until(pending, timeout=60, describe="the group's Workload Pending")
    assert {(p["name"], p["count"]) for p in workload["spec"]["podSets"]} == {("leader", 1), ("worker", 1)}
    queued = kueue_queued(workload, cluster_queue)
    assert queued is not None and f"insufficient quota for {GPU_RESOURCE} in flavor gpu-" in queued.message

    def group_pods() -> list[dict[str, Any]]:
        return list(pods.get(namespace=kueue_namespace, label_selector=f"{LWS_NAME_LABEL}=sglang").to_dict()["items"])

    gated = wait_until(lambda: group_pods() or None, timeout=60, describe="the group's leader pod created")
    for pod in gated:  # the leader (LWS makes the workers once the leader runs): held, on no node
        assert ADMISSION_GATE in [g["name"] for g in pod["spec"].get("schedulingGates") or []]
        assert not pod["spec"].get("nodeName")

    set_gpu_quota(kueue_controller, cluster_queue, 16)

    def group_placed() -> list[dict[str, Any]] | None:
        found = group_pods()
        return found if len(found) == 2 and all(p["spec"].get("nodeName") for p in found) else None

    placed = wait_until(group_placed, timeout=90, describe="the whole group placed once it fits")
    assert {p["spec"]["nodeName"] for p in placed} == set(kueue_controller.gpu_node_names)
    admitted = group_workload()
    assert admitted is not None and (condition(admitted, "Admitted") or {}).get("status") == "True"
    kueue_controller.resource(LWS_API_VERSION, "LeaderWorkerSet").delete(namespace=kueue_namespace, name="sglang")
