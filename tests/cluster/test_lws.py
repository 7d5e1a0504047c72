"""The real LeaderWorkerSet controller in the test control plane: its webhooks inject the group's
environment, its controller makes the leader StatefulSet and the group's worker pods, and the
scheduler places them on the fake GPU nodes."""

from __future__ import annotations

import json
from typing import Any

from tests.harness.controlplane import GPU_RESOURCE, GPU_TOLERATION, Cluster
from tests.harness.lws import LWS_API_VERSION, LWS_NAME_LABEL
from tests.harness.processes import wait_until


def gpu_template(gpus: int) -> dict[str, Any]:
    container = {
        "name": "server",
        "image": "lmsysorg/sglang:v0.5.23",
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }
    return {"spec": {"tolerations": [GPU_TOLERATION], "containers": [container]}}


def leaderworkerset(name: str, *, size: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": size, "workerTemplate": gpu_template(gpus)},
        },
    }


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def test_leaderworkerset_group_of_two_fills_both_gpu_nodes(lws_controller: Cluster, namespace: str) -> None:
    assert len(lws_controller.gpu_node_names) == 2, "this test sizes its group to the default two GPU nodes"
    sets = lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet")
    sets.create(namespace=namespace, body=leaderworkerset("sglang", size=2, gpus=8))
    pods = lws_controller.resource("v1", "Pod")

    def group_running() -> list[dict[str, Any]] | None:
        found = pods.get(namespace=namespace, label_selector=f"{LWS_NAME_LABEL}=sglang").to_dict()["items"]
        if len(found) == 2 and all(p["status"].get("phase") == "Running" for p in found):
            return sorted(found, key=lambda p: p["metadata"]["name"])
        return None

    # Generous: GPU pods of earlier tests may still be terminating with their namespaces.
    leader, worker = wait_until(group_running, timeout=90, describe="the LeaderWorkerSet's leader and worker Running")

    # Leader <set>-<group>, worker <set>-<group>-<index>: the controller's naming.
    assert (leader["metadata"]["name"], worker["metadata"]["name"]) == ("sglang-0", "sglang-0-1")
    assert {leader["spec"]["nodeName"], worker["spec"]["nodeName"]} == set(lws_controller.gpu_node_names)
    # The leader StatefulSet (one leader per group) owns the leader; a StatefulSet per group owns its workers.
    assert leader["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert leader["metadata"]["ownerReferences"][0]["name"] == "sglang"
    assert worker["metadata"]["ownerReferences"][0]["name"] == "sglang-0"
    leader_set = lws_controller.resource("apps/v1", "StatefulSet").get(name="sglang", namespace=namespace)
    assert leader_set.metadata.ownerReferences[0].kind == "LeaderWorkerSet"

    # Injected by the pod webhook at creation, so the API server did reach the manager on loopback.
    address = f"sglang-0.sglang.{namespace}"
    assert env_of(leader) == {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
    assert env_of(worker) == {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}

    def ready() -> bool:
        status = sets.get(name="sglang", namespace=namespace).to_dict().get("status") or {}
        return status.get("readyReplicas") == 1

    wait_until(ready, timeout=60, describe="the LeaderWorkerSet's status readyReplicas=1")

    # Give both nodes' GPUs back before the next test rather than with the namespace's deletion.
    sets.delete(name="sglang", namespace=namespace)
    wait_until(
        lambda: not pods.get(namespace=namespace, label_selector=f"{LWS_NAME_LABEL}=sglang").to_dict()["items"],
        timeout=60,
        describe="the group's pods deleted with their LeaderWorkerSet",
    )


def test_leaderworkerset_webhook_refuses_an_invalid_set(lws_controller: Cluster, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    body = leaderworkerset("bad", size=2, gpus=8)
    # Both zero would leave a rolling update no room to move; only the webhook knows that rule.
    body["spec"]["rolloutStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 0},
    }
    sets = lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet")
    try:
        sets.create(namespace=namespace, body=body)
    except ApiException as error:
        # The validating webhook's refusal, so the API server reached the manager on loopback.
        message = json.loads(error.body)["message"]
        assert 'admission webhook "vleaderworkerset.kb.io" denied the request' in message
        assert error.status == 403  # controller-runtime's denial
        assert "rollingUpdateConfiguration.maxUnavailable: Invalid value" in message
        assert "must not be 0 when `maxSurge` is 0" in message
    else:
        raise AssertionError("a LeaderWorkerSet with maxUnavailable and maxSurge 0 was accepted")


def test_the_operators_group_manifest_is_what_the_real_controller_runs(lws_controller: Cluster, namespace: str) -> None:
    """k8s/server_manifests.py's LeaderWorkerSet, as the operator would create it (less the owner): admitted by
    LWS's webhooks and schema, its leader and worker made as built, the command fed from LWS's env."""
    from datagen_operator.api import parse_run
    from datagen_operator.k8s import object_meta, server_manifests
    from tests.manifests import example_run

    document = example_run(
        **{"spec.server.nodes": 2, "spec.server.tensorParallel": 16, "spec.server.tolerations": [GPU_TOLERATION]}
    )
    spec = parse_run(document).spec
    body = server_manifests.server_leaderworkerset(object_meta.RunRef("kimi", namespace, "no-owner"), spec, 1)
    del body["metadata"]["ownerReferences"]  # no DataGenRun here: the garbage collector would take it
    lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet").create(namespace=namespace, body=body)
    pods = lws_controller.resource("v1", "Pod")

    def group() -> list[dict[str, Any]] | None:
        found = pods.get(namespace=namespace, label_selector=f"{LWS_NAME_LABEL}=kimi-server").to_dict()["items"]
        return sorted(found, key=lambda p: p["metadata"]["name"]) if len(found) == 2 else None

    leader, worker = wait_until(group, timeout=90, describe="the group's leader and worker pods")
    assert (leader["metadata"]["name"], worker["metadata"]["name"]) == ("kimi-server-0", "kimi-server-0-1")
    for pod, rank in ((leader, "0"), (worker, "1")):
        (container,) = pod["spec"]["containers"]
        assert env_of(pod)["LWS_WORKER_INDEX"] == rank
        assert env_of(pod)["LWS_LEADER_ADDRESS"] == f"kimi-server-0.kimi-server.{namespace}"
        assert container["command"][container["command"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert pod["metadata"]["labels"][object_meta.RUN_LABEL] == "kimi"
    assert leader["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    # LWS's own headless Service (not-ready addresses published), the subdomain of both pods.
    service = lws_controller.resource("v1", "Service").get(name="kimi-server", namespace=namespace).to_dict()
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert leader["spec"]["subdomain"] == worker["spec"]["subdomain"] == "kimi-server"
    lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet").delete(name="kimi-server", namespace=namespace)
    wait_until(
        lambda: not pods.get(namespace=namespace, label_selector=f"{LWS_NAME_LABEL}=kimi-server").to_dict()["items"],
        timeout=60,
        describe="the group's pods deleted with their LeaderWorkerSet",
    )
