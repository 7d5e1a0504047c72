"""The ClusterQueue quotas the Kueue tests give their runs, and raising one while a run waits on it."""

from __future__ import annotations

from typing import Any

from tests.harness.controlplane import GPU_RESOURCE
from tests.harness.kueue import KUEUE_API_VERSION

COVERED = ["cpu", "memory", GPU_RESOURCE]
"""What a ClusterQueue for runs covers: the server's GPUs, and the CPU Jobs' cpu and memory."""


def run_quota(gpus: int) -> list[dict[str, str]]:
    """`gpus` GPUs of quota, with cpu and memory to spare."""
    return [
        {"name": "cpu", "nominalQuota": "1000"},
        {"name": "memory", "nominalQuota": "100Ti"},
        {"name": GPU_RESOURCE, "nominalQuota": str(gpus)},
    ]


def set_gpu_quota(cluster: Any, cluster_queue: str, gpus: int) -> None:
    """The ClusterQueue's GPU quota (its first flavor's) set to `gpus`, the rest as it was."""
    queues = cluster.resource(KUEUE_API_VERSION, "ClusterQueue")
    groups = queues.get(name=cluster_queue).to_dict()["spec"]["resourceGroups"]
    for resource in groups[0]["flavors"][0]["resources"]:
        if resource["name"] == GPU_RESOURCE:
            resource["nominalQuota"] = str(gpus)
    queues.patch(
        name=cluster_queue, body={"spec": {"resourceGroups": groups}}, content_type="application/merge-patch+json"
    )
