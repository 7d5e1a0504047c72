"""What every object of a run carries and what observe and inventory read back: its labels and annotations,
the API kinds of LeaderWorkerSet and Kueue, the owner reference to the DataGenRun, the template hash. Pure."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from datagen_operator.api.names import Component
from datagen_operator.api.spec import (
    API_GROUP,
    API_GROUP_VERSION,
    KIND,
    DataGenRunSpec,
)

Manifest = dict[str, Any]

MANAGED_BY = "datagen-operator"
RUN_LABEL = f"{API_GROUP}/run"
COMPONENT_LABEL = f"{API_GROUP}/component"
TEMPLATE_HASH = f"{API_GROUP}/template-hash"
DATA_GENERATION = f"{API_GROUP}/data-generation"
"""On the spec ConfigMap: the run generation whose data-affecting fields are applied (outcomes older are stale)."""
SPEC_CHANGED_GENERATION = f"{API_GROUP}/spec-changed-generation"
"""On the spec ConfigMap: SpecInForce.changed_generation (the last change beyond spec.suspend)."""
SERVER_URLS = f"{API_GROUP}/server-urls"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
"""A server over several nodes (sigs.k8s.io/lws, which must be installed in the cluster)."""
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
"""The Kueue API the operator reads (Workloads, LocalQueues): v0.17's storage version (docs/kueue.md)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On the Workload Kueue makes for a Job: the Job's uid (the operator finds a Job's Workload by it)."""

RESTART_HASH = f"{API_GROUP}/restart-hash"
ADMISSION_HASH = f"{API_GROUP}/admission-hash"
"""On the server's workload: its pod templates' hashes (k8s/server_hashes.py `with_hashes`), read back by inventory."""


@dataclass(frozen=True)
class RunRef:
    """The DataGenRun that owns everything built here."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_GROUP_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def labels(run: str, component: Component) -> dict[str, str]:
    value = str(component)  # plain str: manifests are also dumped as YAML
    return {
        "app.kubernetes.io/name": "datagen",
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/component": value,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        RUN_LABEL: run,
        COMPONENT_LABEL: value,
    }


def selector(run: str, component: Component) -> dict[str, str]:
    return {RUN_LABEL: run, COMPONENT_LABEL: str(component)}


def object_metadata(
    run: RunRef, name: str, component: Component, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": run.namespace,
        "labels": labels(run.name, component),
        "ownerReferences": [run.owner_reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def template_hash(obj: Any) -> str:
    """A short stable hash of a pod template: children are patched (or Jobs recreated) only when it moves."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def kueue_labels(spec: DataGenRunSpec) -> dict[str, str]:
    """Kueue's labels when spec.queue is set, else none: on the server's StatefulSet or LeaderWorkerSet and on
    every Job of the run (preflight, canary, workers, verify, export, release). On the workload object alone:
    Kueue copies what its pods need itself (docs/kueue.md)."""
    if spec.queue is None:
        return {}
    out = {KUEUE_QUEUE_LABEL: spec.queue.name}
    if spec.queue.workload_priority_class_name:
        out[KUEUE_PRIORITY_LABEL] = spec.queue.workload_priority_class_name
    return out
