"""The run's own objects besides its server and Jobs: the applied spec ConfigMap the pods read, the shards'
progress ConfigMaps and the workers' ServiceAccount, Role and RoleBinding. Pure."""

from __future__ import annotations

from typing import Any

import yaml

from datagen_operator.api.names import (
    Component,
    shard_configmap_name,
    spec_configmap_name,
    worker_account_name,
)
from datagen_operator.api.spec import (
    API_GROUP_VERSION,
    KIND,
    DataGenRunSpec,
)
from datagen_operator.k8s.object_meta import (
    DATA_GENERATION,
    SPEC_CHANGED_GENERATION,
    Manifest,
    RunRef,
    object_metadata,
)

# --- the applied spec (which fields may change once bulk records exist: api/live_fields.py) -------


def spec_document(spec: DataGenRunSpec) -> dict[str, Any]:
    """The spec as normalized JSON (defaults filled in), so comparisons ignore spelling."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- per-run objects -----------------------------------------------------------------------------


def run_document(run: RunRef, spec: DataGenRunSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_GROUP_VERSION,
        "kind": KIND,
        "metadata": {"name": run.name, "namespace": run.namespace},
        "spec": spec_document(spec),
    }


def spec_configmap(
    run: RunRef, spec: DataGenRunSpec, data_generation: int, changed_generation: int | None = None
) -> Manifest:
    """The applied run manifest: what canary, worker and verify pods read with --run /etc/datagen/run.yaml."""
    text = yaml.safe_dump(run_document(run, spec), sort_keys=False)
    generations = {DATA_GENERATION: str(data_generation)}
    if changed_generation is not None:
        generations[SPEC_CHANGED_GENERATION] = str(changed_generation)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(run, spec_configmap_name(run.name), Component.SPEC, generations),
        "data": {"run.yaml": text},
    }


def shard_configmap(run: RunRef, index: int) -> Manifest:
    """Pre-created so the worker only needs get/patch on its own name (it writes data['progress.json'])."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(run, shard_configmap_name(run.name, index), Component.PROGRESS),
    }


def worker_service_account(run: RunRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_metadata(run, worker_account_name(run.name), Component.WORKER),
        "automountServiceAccountToken": False,  # only the worker pods mount a token, by their own choice
    }


def worker_role(run: RunRef, shards: int) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_metadata(run, worker_account_name(run.name), Component.WORKER),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [shard_configmap_name(run.name, i) for i in range(shards)],
                "verbs": ["get", "patch"],
            }
        ],
    }


def worker_role_binding(run: RunRef) -> Manifest:
    name = worker_account_name(run.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_metadata(run, name, Component.WORKER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": run.namespace}],
    }
