"""What a change of the server's pod templates asks for: a restart (RESTART_HASH) or Kueue's consent
(ADMISSION_HASH), as two hashes annotated on the workload. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from datagen_operator.k8s.object_meta import (
    ADMISSION_HASH,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    LWS_KIND,
    RESTART_HASH,
    Manifest,
    template_hash,
)

LIVE_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName")
"""The server pod template's live parts (spec.server's placement): a running server keeps the template it
started with; a change reaches the next server start (or at once, while no server pod holds a node)."""
ADMITTED_POD_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "runtimeClassName",
    "priority",
    "topologySpreadConstraints",
    "overhead",
    "resourceClaims",
)
"""The pod fields Kueue admits a workload by, beside its containers' requests and ports (Kueue's
`pkg/util/pod/pod.go` SpecShape): it refuses to change them on a workload it manages (docs/kueue.md)."""


def with_hashes(workload: Manifest) -> Manifest:
    """The StatefulSet (or a group's LeaderWorkerSet) annotated with two hashes of its pod templates:
    - RESTART_HASH, of what needs a server restart: the templates without the live fields (a change of image,
      args, resources, volumes);
    - ADMISSION_HASH, of what Kueue admits it by and refuses to change while it manages it: its queue and
      priority labels and its pods' shape (requests, ports, placement)."""
    if workload["kind"] == LWS_KIND:
        group = workload["spec"]["leaderWorkerTemplate"]
        templates = [group["leaderTemplate"], group["workerTemplate"]]
    else:
        templates = [workload["spec"]["template"]]
    restart = [{**t, "spec": {k: v for k, v in t["spec"].items() if k not in LIVE_POD_FIELDS}} for t in templates]
    labels = workload["metadata"].get("labels", {})
    admission = {
        "labels": {key: labels[key] for key in (KUEUE_QUEUE_LABEL, KUEUE_PRIORITY_LABEL) if key in labels},
        "pods": [_admitted_shape(t["spec"]) for t in templates],
    }
    annotations = {
        **workload["metadata"].get("annotations", {}),
        RESTART_HASH: template_hash(restart[0] if len(restart) == 1 else restart),
        ADMISSION_HASH: template_hash(admission),
    }
    return {**workload, "metadata": {**workload["metadata"], "annotations": annotations}}


def _admitted_shape(pod: Mapping[str, Any]) -> dict[str, Any]:
    def containers(key: str) -> list[dict[str, Any]]:
        return [
            {"requests": (c.get("resources") or {}).get("requests"), "ports": c.get("ports")}
            for c in pod.get(key) or []
        ]

    return {
        "initContainers": containers("initContainers"),
        "containers": containers("containers"),
        **{key: pod.get(key) for key in ADMITTED_POD_FIELDS},
    }
