"""Every child of a run, once: its kind, its name, its component label, how it is built, and the kinds the
operator watches. The planner names children (k8s/children.py `Child`); the inventory, the executor, the
finalizer and the handlers' indexes read what those names are here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from datagen_operator.api.names import (
    Component,
    server_name,
    server_pod_name,
    shard_configmap_name,
    worker_account_name,
    workers_job_name,
)
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.k8s import job_manifests, object_meta, run_manifests, server_manifests
from datagen_operator.k8s.children import Child


@dataclass(frozen=True)
class BuildInputs:
    """What one pass builds its children from."""

    run: object_meta.RunRef
    spec: DataGenRunSpec
    image: str
    """The worker image the run's pods start with."""
    data_generation: int
    urls: Sequence[str]
    """The server URLs a Job's pods send to (the planner's, for the canary and the workers)."""
    index: int = 0
    """The shard's or the server replica's index, for the children there is one of each."""
    taken_before: float | None = None
    """The release Job: the halt's time."""
    concurrency: int | None = None
    """The workers' Job: clients.concurrency auto's number, as the canary resolved it."""


@dataclass(frozen=True)
class Entry:
    kind: str
    name: Callable[[str, int], str]
    """(run name, index) -> the child's name."""
    component: Component
    """Its component label; a Job's pods carry it too."""
    build: Callable[[BuildInputs], object_meta.Manifest] | None = None
    """None: not built from here. The server workload is served (k8s/children.py `Serve`): its template
    comes from the resolved model and the pass keeps a running one."""


def _single(name: Callable[[str], str]) -> Callable[[str, int], str]:
    return lambda run, _index: name(run)


def _step(component: Component, build: Callable[[BuildInputs], object_meta.Manifest]) -> Entry:
    """A step Job: its name from manifests' STEP_JOBS, the one table of the steps."""
    return Entry("Job", _single(job_manifests.STEP_JOBS[component].name), component, build)


REGISTRY: dict[Child, Entry] = {
    Child.WORKER_ACCOUNT: Entry(
        "ServiceAccount",
        _single(worker_account_name),
        Component.WORKER,
        lambda b: run_manifests.worker_service_account(b.run),
    ),
    Child.WORKER_ROLE: Entry(
        "Role",
        _single(worker_account_name),
        Component.WORKER,
        lambda b: run_manifests.worker_role(b.run, b.spec.clients.shards),
    ),
    Child.WORKER_ROLE_BINDING: Entry(
        "RoleBinding",
        _single(worker_account_name),
        Component.WORKER,
        lambda b: run_manifests.worker_role_binding(b.run),
    ),
    # Its data is the worker's: only the metadata is the operator's, so it never drifts.
    Child.SHARD_PROGRESS: Entry(
        "ConfigMap", shard_configmap_name, Component.PROGRESS, lambda b: run_manifests.shard_configmap(b.run, b.index)
    ),
    Child.HEADLESS_SERVICE: Entry(
        "Service", _single(server_name), Component.SERVER, lambda b: server_manifests.headless_service(b.run, b.spec)
    ),
    Child.REPLICA_SERVICE: Entry(
        "Service", server_pod_name, Component.SERVER, lambda b: server_manifests.replica_service(b.run, b.spec, b.index)
    ),
    Child.SERVER_STATEFULSET: Entry("StatefulSet", _single(server_name), Component.SERVER),
    Child.SERVER_GROUP: Entry(object_meta.LWS_KIND, _single(server_name), Component.SERVER),
    # The Jobs, in the order the finalizer stops them: the workers before the server, so they drain.
    Child.PREFLIGHT: _step(
        Component.PREFLIGHT, lambda b: job_manifests.preflight_job(b.run, b.spec, b.image, b.data_generation)
    ),
    Child.CANARY: _step(
        Component.CANARY, lambda b: job_manifests.canary_job(b.run, b.spec, b.image, list(b.urls), b.data_generation)
    ),
    Child.WORKERS: Entry(
        "Job",
        _single(workers_job_name),
        Component.WORKER,
        lambda b: job_manifests.workers_job(
            b.run, b.spec, b.image, list(b.urls), suspend=False, concurrency=b.concurrency
        ),
    ),
    Child.VERIFY: _step(Component.VERIFY, lambda b: job_manifests.verify_job(b.run, b.spec, b.image)),
    Child.EXPORT: _step(Component.EXPORT, lambda b: job_manifests.export_job(b.run, b.spec, b.image)),
    Child.RELEASE: _step(
        Component.RELEASE, lambda b: job_manifests.release_job(b.run, b.spec, b.image, b.taken_before)
    ),
}

JOBS: tuple[Child, ...] = tuple(child for child, entry in REGISTRY.items() if entry.kind == "Job")


def child_name(child: Child, run: str, index: int = 0) -> str:
    return REGISTRY[child].name(run, index)


def build(child: Child, inputs: BuildInputs) -> object_meta.Manifest:
    entry = REGISTRY[child]
    if entry.build is None:
        raise ValueError(f"{child} is not built by the executor, only served, scaled or deleted")
    return entry.build(inputs)


@dataclass(frozen=True)
class Watched:
    """A kind of object the operator keeps an index of (the run's children and their pods), by run."""

    kind: str
    group: str
    """The API group; "" for the core group."""
    version: str
    plural: str

    @property
    def index_id(self) -> str:
        """The kopf index's name (a daemon's keyword argument)."""
        return f"run_{self.plural}"


WATCHED: tuple[Watched, ...] = (
    Watched("Pod", "", "v1", "pods"),
    Watched("Job", "batch", "v1", "jobs"),
    Watched("StatefulSet", "apps", "v1", "statefulsets"),
    Watched("ConfigMap", "", "v1", "configmaps"),
    Watched("Service", "", "v1", "services"),
    Watched("ServiceAccount", "", "v1", "serviceaccounts"),
    Watched("Role", "rbac.authorization.k8s.io", "v1", "roles"),
    Watched("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings"),
)
"""The LeaderWorkerSet is not watched: it is read once per pass, so the operator runs where LWS is not installed."""
