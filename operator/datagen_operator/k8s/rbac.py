"""The operator's own permissions, as data: the Helm chart renders them, the tests bind them.

Least privilege: watch and create what a run owns, patch (server-side apply) what it changes, delete only what
the finalizer stops (workers, then the server) or replaces (a stale Job). No secrets (env secretKeyRefs pass through
the pod spec unread), no pod deletes, no exec, no volumes.
"""

from __future__ import annotations

from typing import Any

from datagen_operator.api.spec import API_GROUP, PLURAL

Rule = dict[str, Any]

CLUSTER_RULES: tuple[Rule, ...] = (
    {"apiGroups": [API_GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [API_GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch"]},
    # ownerReferences with blockOwnerDeletion need update on the owner's finalizers subresource
    {"apiGroups": [API_GROUP], "resources": [f"{PLURAL}/finalizers"], "verbs": ["update"]},
    # observed: pods (scheduling, container states, termination messages); shard progress ConfigMaps
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch"]},
    # the access modes of the claims a run names (k8s/storage.py); never their content
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
    # children owned whole: watched (list, watch) and applied server-side (patch; create when missing)
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["list", "watch", "create", "patch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    # a server over several nodes (server.nodes > 1): read each pass (not watched, so the operator runs where LWS is
    # not installed), created, scaled, deleted by the finalizer
    {
        "apiGroups": ["leaderworkerset.x-k8s.io"],
        "resources": ["leaderworkersets"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    # a queued server (spec.queue): Kueue's Workloads owned by it, listed each pass (not watched, so the operator
    # runs where Kueue is not installed), and the LocalQueue's ClusterQueue while one is not admitted; a Job Kueue
    # manages: its Workload listed, and patched (spec.active) to pause and resume it; a preempting Workload listed
    # by its job's uid (any namespace: a cohort spans them) to name the run a preemption made room for
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list", "patch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get"]},
    # the worker Role grants get/patch on configmaps, which the operator holds itself (no escalate/bind)
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["list", "watch", "create", "patch"],
    },
    # events: posted about runs; listed (by involved object) to read a controller's FailedCreate refusal
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["list", "create", "patch"]},
)
"""Cluster-wide: runs live in any namespace."""


def cluster_role(name: str = "datagen-operator") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [dict(rule) for rule in CLUSTER_RULES],
    }
