"""The executor of the planner's actions (k8s/children.py `plan`): it builds the manifest each action
names (k8s/registry.py) and sends it, in the plan's order; it decides nothing. A write the API server refuses
(invalid, quota, admission, RBAC) is kept in its words for ChildrenAccepted and the pass goes on. Also the
finalizer's work (`stop_children`), which stops the same children by the same names."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api.names import server_name, workers_job_name
from datagen_operator.k8s import object_meta
from datagen_operator.k8s.children import (
    Action,
    ActivateWorkload,
    Apply,
    Child,
    Create,
    Delete,
    Serve,
    SuspendWorkers,
)
from datagen_operator.k8s.context import RunCache
from datagen_operator.k8s.kube import Kube, drifted, namespace_terminating, refusal
from datagen_operator.k8s.registry import JOBS, REGISTRY, BuildInputs, build, child_name

log = logging.getLogger("datagen.operator")

LWS_MISSING = (
    "LeaderWorkerSet is not installed in this cluster (no leaderworkersets.leaderworkerset.x-k8s.io): a server over "
    "several nodes (server.nodes > 1) is a LeaderWorkerSet group; install LWS (docs/install.md) or set server.nodes "
    "to 1"
)


@dataclass
class Executor:
    kube: Kube
    cache: RunCache
    refused_writes: dict[str, str] = field(default_factory=dict)
    """'Kind/name' -> the API server's words, for writes it refused; cleared when the same write succeeds."""

    @property
    def namespace(self) -> str:
        return self.cache.namespace

    @property
    def name(self) -> str:
        return self.cache.name

    async def write(self, kind: str, name: str, write: Callable[[], Awaitable[Any]]) -> bool:
        """One write to the API server. A refusal is kept for ChildrenAccepted and False returned; anything else
        raises (the next pass retries), a namespace being deleted too (the run is let go)."""
        key = f"{kind}/{name}"
        try:
            await write()
        except ApiException as error:
            if namespace_terminating(error):
                raise  # not a refusal of this child: the namespace goes (run_pass lets the run go)
            words = refusal(error)
            if kind == object_meta.LWS_KIND and error.status == 404:
                words = LWS_MISSING
            if words is None:
                raise
            if self.refused_writes.get(key) != words:
                log.warning("%s/%s: the API server refused %s: %s", self.namespace, self.name, key, words)
            self.refused_writes[key] = words
            return False
        self.refused_writes.pop(key, None)
        return True

    async def create(self, manifest: object_meta.Manifest) -> bool:
        return await self.write(manifest["kind"], manifest["metadata"]["name"], lambda: self.kube.create(manifest))

    async def apply(self, manifest: object_meta.Manifest) -> None:
        """A watched child the operator owns whole (Services, the workers' RBAC, shard ConfigMaps): applied
        server-side when it is missing or a field the operator sets was changed by hand; else nothing is sent."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if drifted(manifest, self.cache.named(kind, name)):
            await self.write(kind, name, lambda: self.kube.apply(manifest))

    async def record_spec(
        self, manifest: object_meta.Manifest, existing: Mapping[str, Any] | None, changed: bool
    ) -> None:
        """The spec-in-force ConfigMap, created or patched when the spec in force moved."""
        if existing is None:
            await self.kube.create(manifest)
        elif changed:
            name = manifest["metadata"]["name"]
            body = {"metadata": manifest["metadata"], "data": manifest["data"]}
            await self.kube.patch("ConfigMap", self.namespace, name, body)

    async def carry_out(
        self,
        actions: Sequence[Action],
        inputs: BuildInputs,
        server: object_meta.Manifest,
        workload: Mapping[str, Any] | None,
    ) -> None:
        """Sends the plan's actions in order. `server` is the workload the spec asks for, `workload` the running
        one (a `Serve` that keeps its template scales it only)."""
        for action in actions:
            match action:
                case Apply(child, index):
                    await self.apply(build(child, replace(inputs, index=index)))
                case Create(child, urls, taken_before, concurrency):
                    built = replace(inputs, urls=urls, taken_before=taken_before, concurrency=concurrency)
                    await self.create(build(child, built))
                case Delete(child, index, why):
                    kind, name = REGISTRY[child].kind, child_name(child, self.name, index)
                    if why:
                        log.info("%s/%s: %s %s %s", self.namespace, self.name, kind, name, why)
                    await self.kube.delete(kind, self.namespace, name)
                case Serve(replicas, keep_template):
                    await self._serve(replicas, workload if keep_template and workload else server, workload)
                case SuspendWorkers(suspend):
                    body = {"spec": {"suspend": suspend}}
                    await self.kube.patch("Job", self.namespace, workers_job_name(self.name), body)
                case ActivateWorkload(child, named, active):
                    log.info(
                        "%s/%s: Job %s %s through its Kueue Workload %s (spec.active: %s)",
                        self.namespace,
                        self.name,
                        child_name(child, self.name),
                        "resumed" if active else "paused",
                        named,
                        str(active).lower(),
                    )
                    await self.write(
                        "Workload", named, lambda: self.kube.activate_workload(self.namespace, named, active)
                    )

    async def _serve(self, replicas: int, template: Mapping[str, Any], existing: Mapping[str, Any] | None) -> None:
        wanted = {**template, "spec": {**template["spec"], "replicas": replicas}}
        scale = {"spec": {"replicas": replicas}}
        await self.write(
            wanted["kind"], server_name(self.name), lambda: self.kube.ensure(wanted, existing, patch=scale)
        )


SERVER_WORKLOADS = (Child.SERVER_GROUP, Child.SERVER_STATEFULSET)
"""Stopped after every Job; the group first (its CRD may be missing: then it reads as absent)."""


async def stop_children(kube: Kube, namespace: str, name: str) -> str | None:
    """The finalizer's work, one step per call: None when done, else what it waits for.

    Workers stop before the server so they drain (SIGTERM: finish in-flight, fsync) instead of failing on a
    vanished server. The garbage collector removes the rest through owner references; no volume is touched."""
    for child in (*JOBS, *SERVER_WORKLOADS):
        kind, child_of_run = REGISTRY[child].kind, child_name(child, name)
        existing = await kube.read(kind, namespace, child_of_run)
        if existing is not None:
            if not (existing.get("metadata") or {}).get("deletionTimestamp"):
                await kube.delete(kind, namespace, child_of_run, propagation="Foreground")
            if kind == "Job":
                return f"waiting for Job {child_of_run} and its pods to stop"
            return (
                "waiting for the server groups to stop"
                if kind == object_meta.LWS_KIND
                else "waiting for the server pods to stop"
            )
    return None
