"""The parts every pod of a run is built from: volumes and their mounts, env, resources, security contexts and
the CPU pods' placement. Pure."""

from __future__ import annotations

import math
from typing import Any

from datagen_operator.api.kube_types import EnvVar, VolumeSource
from datagen_operator.api.names import spec_configmap_name
from datagen_operator.api.paths import DATASET_MOUNT, OUTPUT_MOUNT
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.k8s.pod_paths import RUN_FILE_DIR

GPU_RESOURCE = "nvidia.com/gpu"

# --- security: every pod the operator creates ---
WORKER_UID = 10001
"""The datagen image's user and group (images/Dockerfile.worker); fsGroup makes the output writable for it."""
SCRATCH_HOME = "/home/datagen"
"""The datagen pods' HOME on an emptyDir, the one writable place besides the output (the root filesystem is
read-only): transformers writes a remote-code tokenizer's modules under $HOME/.cache/huggingface/modules."""
SCRATCH_SIZE = "2Gi"
SERVER_CPU_PER_GPU = 4
SERVER_MEMORY_PER_GPU_GI = 32
"""Default server requests per GPU when server.cpu/memory are unset; memory comes on top of shmSize, because
the memory-backed /dev/shm counts against the pod's memory limit."""


# --- volumes -------------------------------------------------------------------------------------


def volume_source(source: VolumeSource, *, read_only: bool) -> dict[str, Any]:
    if source.persistent_volume_claim is not None:
        claim = source.persistent_volume_claim
        return {"persistentVolumeClaim": {"claimName": claim.claim_name, "readOnly": read_only or claim.read_only}}
    if source.host_path is not None:
        return {"hostPath": {"path": source.host_path.path, "type": "Directory" if read_only else "DirectoryOrCreate"}}
    assert source.nfs is not None
    return {
        "nfs": {"server": source.nfs.server, "path": source.nfs.path, "readOnly": read_only or source.nfs.read_only}
    }


def model_volume(spec: DataGenRunSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if spec.model.volume is None:
        return [], []
    volume = {"name": "model", **volume_source(spec.model.volume, read_only=True)}
    mount: dict[str, Any] = {"name": "model", "mountPath": spec.model.path, "readOnly": True}
    if spec.model.sub_path:
        mount["subPath"] = spec.model.sub_path  # one shared models volume, one folder per model
    return [volume], [mount]


def dataset_and_output_volumes(
    spec: DataGenRunSpec, *, dataset: bool, output: bool, output_writable: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Dataset and output volumes; one volume when both name the same source (one claim, two mounts)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    output_name = None
    if output and spec.output.volume is not None:
        output_name = "output"
        volumes.append({"name": "output", **volume_source(spec.output.volume, read_only=not output_writable)})
        mounts.append({"name": "output", "mountPath": OUTPUT_MOUNT, "readOnly": not output_writable})
    if dataset and spec.dataset.volume is not None:
        name = output_name if output_name and spec.dataset.volume == spec.output.volume else "dataset"
        if name == "dataset":
            volumes.append({"name": "dataset", **volume_source(spec.dataset.volume, read_only=True)})
        mounts.append({"name": name, "mountPath": DATASET_MOUNT, "readOnly": True})
    return volumes, mounts


def run_file_volume(run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {
        "name": "run",
        "configMap": {"name": spec_configmap_name(run), "items": [{"key": "run.yaml", "path": "run.yaml"}]},
    }
    return volume, {"name": "run", "mountPath": RUN_FILE_DIR, "readOnly": True}


def env_vars(env: list[EnvVar]) -> list[dict[str, Any]]:
    """Env for the server; secrets stay references (the operator never reads a secret's value)."""
    out: list[dict[str, Any]] = []
    for var in env:
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            out.append({"name": var.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
        else:
            out.append({"name": var.name, "value": var.value})
    return out


def client_resources(cpu: str | None, memory: str | None) -> dict[str, Any]:
    """The CPU pods (Burstable): cpu requested but not capped (tokenizing bursts), memory capped at its request."""
    out: dict[str, Any] = {}
    if cpu:
        out.setdefault("requests", {})["cpu"] = cpu
    if memory:
        out.setdefault("requests", {})["memory"] = memory
        out.setdefault("limits", {})["memory"] = memory
    return out


def _gibibytes(quantity: str) -> float:
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10, "Pi": 2**20, "k": 1e3 / 2**30, "M": 1e6 / 2**30,
             "G": 1e9 / 2**30, "T": 1e12 / 2**30, "P": 1e15 / 2**30}  # fmt: skip
    number = quantity.rstrip("KMGTPik")
    return float(number) * units.get(quantity[len(number) :], 2**-30)


def server_resources(spec: DataGenRunSpec) -> dict[str, Any]:
    """QoS class Guaranteed on purpose (requests == limits for GPUs, cpu and memory): the kubelet evicts and
    OOM-kills a Guaranteed pod last, and only Guaranteed pods get exclusive cores from a static CPU manager,
    aligned to the GPUs' NUMA node by the Topology Manager. A lost server costs a model load on every GPU."""
    server = spec.server
    cpu = server.cpu or str(SERVER_CPU_PER_GPU * server.gpus)
    memory = server.memory or f"{math.ceil(_gibibytes(server.shm_size)) + SERVER_MEMORY_PER_GPU_GI * server.gpus}Gi"
    # Extended resources go in limits; a request, if present, must equal the limit.
    amounts = {GPU_RESOURCE: str(server.gpus), "cpu": cpu, "memory": memory}
    return {"limits": dict(amounts), "requests": dict(amounts)}


def no_privileges(*, read_only_root: bool) -> dict[str, Any]:
    """Container securityContext: what the `restricted` Pod Security Standard asks of every container."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root,
    }


def datagen_pod_security() -> dict[str, Any]:
    """Pod securityContext of the preflight, canary, worker and verify pods: `restricted`, as the image's user.
    fsGroup makes a PVC's output folder group-writable for it (OnRootMismatch: no recursive chown of a full
    volume on every start; hostPath and NFS volumes ignore fsGroup, see docs/operator.md)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": WORKER_UID,
        "runAsGroup": WORKER_UID,
        "fsGroup": WORKER_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def server_pod_security() -> dict[str, Any]:
    """The SGLang pod: `restricted` except runAsNonRoot. The lmsysorg/sglang image has no USER (it runs as root),
    installs SGLang editable under /sgl-workspace and keeps its downloaded kernels under /root/.cache; another
    uid would lose them. Root without capabilities, escalation or a writable host path is as close as it gets."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def client_placement(spec: DataGenRunSpec) -> dict[str, Any]:
    """nodeSelector and tolerations of every CPU pod of the run (preflight, canary, workers, verify)."""
    clients = spec.clients
    placement: dict[str, Any] = {}
    if clients.node_selector:
        placement["nodeSelector"] = dict(clients.node_selector)
    if clients.tolerations:
        placement["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in clients.tolerations
        ]
    return placement
