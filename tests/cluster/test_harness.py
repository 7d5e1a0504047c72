"""Proof that the test control plane is a real one: the scheduler places and refuses GPU pods, kwok
runs them, the garbage collector follows owner references, CRD schemas are enforced and RBAC denies."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.harness.cluster_fixtures import ServiceAccountKubeconfig, SubjectRunner
from tests.harness.controlplane import (
    GPU_PRODUCT,
    GPU_RESOURCE,
    GPU_TOLERATION,
    Cluster,
    LocalControlPlane,
    condition_status,
)
from tests.harness.processes import wait_until
from tests.harness.testbin import BUILD_SCRIPT


def pinned_k8s_version() -> str:
    """The release hack/testbin/build.sh builds, its single source of truth."""
    match = re.search(r"^K8S_VERSION=(\S+)", BUILD_SCRIPT.read_text(), re.MULTILINE)
    assert match, f"no K8S_VERSION= in {BUILD_SCRIPT}"
    return match[1]


def gpu_pod_spec(gpus: int) -> dict[str, Any]:
    return {
        "tolerations": [GPU_TOLERATION],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "containers": [
            {
                "name": "server",
                "image": "lmsysorg/sglang:v0.5.23",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
            }
        ],
    }


def api_error_message(error: ApiException) -> str:
    return str(json.loads(error.body)["message"])


def test_kube_apiserver_is_the_pinned_release(control_plane: Cluster) -> None:
    if not isinstance(control_plane, LocalControlPlane):
        pytest.skip("checks the binary built by hack/testbin; an existing cluster runs its own release")
    printed = subprocess.run(
        [control_plane.binary("kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert printed.strip() == f"Kubernetes {pinned_k8s_version()}"
    # The running server agrees with its binary.
    assert control_plane.dynamic().version["kubernetes"]["gitVersion"] == pinned_k8s_version()


def test_failure_report_names_every_component_and_its_log(control_plane: Cluster) -> None:
    report = control_plane.failure_report(lines=5)
    for process in control_plane.processes:
        assert f"--- {process.name} (running) {process.log_path}" in report
    assert str(control_plane.logs_dir) in report


def test_fake_gpu_nodes_look_like_a_gpu_pool(control_plane: Cluster) -> None:
    nodes = control_plane.resource("v1", "Node")
    for name in control_plane.gpu_node_names:
        node = nodes.get(name=name).to_dict()
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == GPU_PRODUCT
        assert {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert condition_status(node, "Ready") == "True"


def test_deployment_pod_lands_on_a_gpu_node_and_runs(control_plane: Cluster, namespace: str) -> None:
    labels = {"app": "sglang"}
    control_plane.resource("apps/v1", "Deployment").create(
        namespace=namespace,
        body={
            "metadata": {"name": "sglang"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": gpu_pod_spec(8)},
            },
        },
    )
    pods = control_plane.resource("v1", "Pod")

    def running_pod() -> dict[str, Any] | None:
        for pod in pods.get(namespace=namespace, label_selector="app=sglang").to_dict()["items"]:
            if pod["status"].get("phase") == "Running" and condition_status(pod, "Ready") == "True":
                return pod
        return None

    pod = wait_until(running_pod, timeout=60, describe="the Deployment's pod Running")
    assert pod["spec"]["nodeName"] in control_plane.gpu_node_names
    # Deployment -> ReplicaSet -> Pod: the deployment and replicaset controllers made it.
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"
    replica_set = control_plane.resource("apps/v1", "ReplicaSet").get(name=owner["name"], namespace=namespace)
    assert replica_set.metadata.ownerReferences[0].kind == "Deployment"


def test_pod_asking_for_16_gpus_stays_pending_as_unschedulable(control_plane: Cluster, namespace: str) -> None:
    pods = control_plane.resource("v1", "Pod")
    pods.create(namespace=namespace, body={"metadata": {"name": "too-big"}, "spec": gpu_pod_spec(16)})

    def scheduling_refusal() -> dict[str, Any] | None:
        pod = pods.get(name="too-big", namespace=namespace).to_dict()
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return {"pod": pod, "condition": condition}
        return None

    refusal = wait_until(scheduling_refusal, timeout=30, describe="the scheduler's PodScheduled=False")
    assert refusal["condition"]["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in refusal["condition"]["message"]
    assert refusal["pod"]["status"]["phase"] == "Pending"
    assert not refusal["pod"]["spec"].get("nodeName")


def test_gpu_taint_keeps_pods_without_the_toleration_off(control_plane: Cluster, namespace: str) -> None:
    pods = control_plane.resource("v1", "Pod")
    spec = gpu_pod_spec(8)
    del spec["tolerations"]
    pods.create(namespace=namespace, body={"metadata": {"name": "intolerant"}, "spec": spec})

    def refusal_message() -> str | None:
        for condition in pods.get(name="intolerant", namespace=namespace).status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                return str(condition.message)
        return None

    message = wait_until(refusal_message, timeout=30, describe="the scheduler's PodScheduled=False")
    # The scheduler counts the nodes without naming the taint; all GPU nodes carry only ours.
    assert f"{len(control_plane.gpu_node_names)} node(s) had untolerated taint" in message


def test_deleting_an_owner_garbage_collects_its_dependents(control_plane: Cluster, namespace: str) -> None:
    config_maps = control_plane.resource("v1", "ConfigMap")
    owner = config_maps.create(namespace=namespace, body={"metadata": {"name": "owner"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    config_maps.create(namespace=namespace, body={"metadata": {"name": "dependent", "ownerReferences": [reference]}})
    config_maps.create(namespace=namespace, body={"metadata": {"name": "bystander"}})

    config_maps.delete(name="owner", namespace=namespace)

    def dependent_gone() -> bool:
        names = {cm.metadata.name for cm in config_maps.get(namespace=namespace).items}
        return "dependent" not in names

    wait_until(dependent_gone, timeout=30, describe="the garbage collector to delete the dependent")
    assert config_maps.get(name="bystander", namespace=namespace).metadata.name == "bystander"


def throwaway_crd(group: str) -> dict[str, Any]:
    spec_schema = {
        "type": "object",
        "required": ["gpus"],
        "properties": {"gpus": {"type": "integer", "minimum": 1}, "image": {"type": "string"}},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}},
                }
            ],
        },
    }


def test_custom_resource_violating_the_schema_is_refused_naming_the_field(
    control_plane: Cluster, namespace: str
) -> None:
    from kubernetes import client

    group = f"h{secrets.token_hex(3)}.harness.datagen.dev"
    crds = control_plane.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    crds.create(body=throwaway_crd(group))
    try:
        control_plane.wait_for_crd(f"probes.{group}")
        custom = client.CustomObjectsApi(control_plane.api_client())

        def create(name: str, gpus: int) -> Any:
            body = {"apiVersion": f"{group}/v1", "kind": "Probe", "metadata": {"name": name}, "spec": {"gpus": gpus}}
            return custom.create_namespaced_custom_object(group, "v1", namespace, "probes", body)

        with pytest.raises(ApiException) as refused:
            create("zero", 0)
        assert refused.value.status == 422
        assert "spec.gpus" in api_error_message(refused.value)
        assert create("one", 1)["spec"]["gpus"] == 1  # the same request with a valid value passes
    finally:
        crds.delete(name=f"probes.{group}")


def test_datagenrun_with_zero_gpus_is_refused_naming_the_field(control_plane: Cluster, namespace: str) -> None:
    from kubernetes import client

    crd_file = control_plane.settings.crd_dir / "datagenrun.yaml"
    if not crd_file.exists():
        pytest.skip(f"{crd_file} does not exist (generated by `make crd`), so the fixture installed none")
    crd = yaml.safe_load(crd_file.read_text())
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
    run = {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": "zero-gpus"},
        "spec": {
            "model": {"preset": "kimi-k2.5", "path": "/models/kimi-k2.5-int4"},
            "server": {"image": "lmsysorg/sglang:v0.5.23", "gpus": 0, "tensorParallel": 8},
            "dataset": {"path": "prompts/b1.jsonl"},
            "output": {"path": "eagle3/b1"},
        },
    }
    custom = client.CustomObjectsApi(control_plane.api_client())
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(group, version, namespace, crd["spec"]["names"]["plural"], run)
    assert refused.value.status == 422
    assert "spec.server.gpus" in api_error_message(refused.value)


def test_service_account_without_a_permission_gets_403(
    control_plane: Cluster, namespace: str, service_account_kubeconfig: ServiceAccountKubeconfig
) -> None:
    rbac = control_plane.resource("rbac.authorization.k8s.io/v1", "Role")
    rbac.create(
        namespace=namespace,
        body={
            "metadata": {"name": "configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    control_plane.resource("rbac.authorization.k8s.io/v1", "RoleBinding").create(
        namespace=namespace,
        body={
            "metadata": {"name": "reader-reads-configmaps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    reader = service_account_kubeconfig("reader")
    config_maps = control_plane.resource("v1", "ConfigMap", kubeconfig=reader)
    pods = control_plane.resource("v1", "Pod", kubeconfig=reader)

    # The binding reaches the authorizer's cache within moments; the granted verb then works ...
    wait_until(lambda: config_maps.get(namespace=namespace), timeout=15, describe="the RoleBinding to apply")
    # ... and everything not granted is refused, naming the ServiceAccount.
    with pytest.raises(ApiException) as refused:
        pods.get(namespace=namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:reader" in api_error_message(refused.value)
    with pytest.raises(ApiException) as refused_write:
        config_maps.create(namespace=namespace, body={"metadata": {"name": "nope"}})
    assert refused_write.value.status == 403


WHO_AM_I = textwrap.dedent(
    """
    import json, os
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    api = config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    review = client.AuthenticationV1Api(api).create_self_subject_review({})
    try:
        client.CoreV1Api(api).list_namespaced_secret(os.environ["NAMESPACE"])
        secrets = "allowed"
    except ApiException as error:
        secrets = error.status
    print(json.dumps({"user": review.status.user_info.username, "list_secrets": secrets}))
    """
)


def test_subject_runs_as_its_service_account(
    control_plane: Cluster, namespace: str, run_as_service_account: SubjectRunner
) -> None:
    subject = run_as_service_account("whoami", [sys.executable, "-c", WHO_AM_I], "worker", env={"NAMESPACE": namespace})
    subject.popen.wait(timeout=60)
    output = subject.log_path.read_text()
    assert subject.popen.returncode == 0, output
    result = json.loads(output.strip().splitlines()[-1])
    assert result == {"user": f"system:serviceaccount:{namespace}:worker", "list_secrets": 403}
