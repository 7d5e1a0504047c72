"""The operator's calls to the API server (kubernetes_asyncio): create-or-patch of owned children, status
writes, deletes. Nothing else in the operator talks to the API server (kopf's watches aside)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL
from datagen_operator.k8s.object_facts import annotation
from datagen_operator.k8s.object_meta import (
    KUEUE_API_VERSION,
    KUEUE_JOB_UID_LABEL,
    LWS_API_VERSION,
    LWS_KIND,
    TEMPLATE_HASH,
    Manifest,
)

FIELD_MANAGER = "datagen-operator"
"""Who owns the fields the operator applies (metadata.managedFields)."""


class Kube:
    """Typed-API dispatch by kind; bodies are plain dicts (what the k8s/*_manifests.py builders build)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.writes = 0
        """API writes made (creates, patches, deletes): the benchmark reads it."""

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        path = kubeconfig or os.environ.get("KUBECONFIG")
        configuration = client.Configuration()
        if path:
            await config.load_kube_config(config_file=path, client_configuration=configuration)
        else:
            load_incluster: Callable[..., None] = config.load_incluster_config  # the library has no type hints
            load_incluster(client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    def _plain(self, obj: Any) -> dict[str, Any]:
        """A client model as the plain JSON dict the API server sent (what the watch cache holds too)."""
        plain: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return plain

    def _ops(self, kind: str) -> tuple[Any, Any, Any, Any]:
        """(create, read, patch, delete) for a namespaced kind."""
        if kind == LWS_KIND:
            return self._lws_ops()
        table = {
            "ConfigMap": (self.core, "config_map"),
            "Service": (self.core, "service"),
            "ServiceAccount": (self.core, "service_account"),
            "StatefulSet": (self.apps, "stateful_set"),
            "Job": (self.batch, "job"),
            "Role": (self.rbac, "role"),
            "RoleBinding": (self.rbac, "role_binding"),
        }
        api, noun = table[kind]
        return (
            getattr(api, f"create_namespaced_{noun}"),
            getattr(api, f"read_namespaced_{noun}"),
            getattr(api, f"patch_namespaced_{noun}"),
            getattr(api, f"delete_namespaced_{noun}"),
        )

    def _lws_ops(self) -> tuple[Any, Any, Any, Any]:
        """The same calls for LeaderWorkerSets, a custom resource (absent where LWS is not installed: 404)."""
        group, version = LWS_API_VERSION.split("/")
        custom, plural = self.custom, "leaderworkersets"
        return (
            lambda namespace, body: custom.create_namespaced_custom_object(group, version, namespace, plural, body),
            lambda name, namespace: custom.get_namespaced_custom_object(group, version, namespace, plural, name),
            lambda name, namespace, body, **kw: custom.patch_namespaced_custom_object(
                group, version, namespace, plural, name, body, **kw
            ),
            lambda name, namespace, **kw: custom.delete_namespaced_custom_object(
                group, version, namespace, plural, name, **kw
            ),
        )

    async def create(self, manifest: Manifest) -> bool:
        """Create; False when it already exists (a restarted operator re-adopts by name)."""
        create, *_ = self._ops(manifest["kind"])
        try:
            self.writes += 1
            await create(manifest["metadata"]["namespace"], manifest)
            return True
        except ApiException as error:
            if error.status == 409:
                return False
            raise

    async def read(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        _, read, _, _ = self._ops(kind)
        try:
            return self._plain(await read(name, namespace))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def patch(self, kind: str, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        _, _, patch, _ = self._ops(kind)
        self.writes += 1
        await patch(name, namespace, body, field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json")

    async def apply(self, manifest: Manifest) -> Mapping[str, Any]:
        """Server-side apply as the operator's field manager, forced: the fields in `manifest` are ours, and a
        hand edit of one of them (another manager) is taken back. Returns the object as stored."""
        _, _, patch, _ = self._ops(manifest["kind"])
        meta = manifest["metadata"]
        self.writes += 1
        applied = await patch(
            meta["name"],
            meta["namespace"],
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        return self._plain(applied)

    async def delete(self, kind: str, namespace: str, name: str, propagation: str = "Background") -> bool:
        *_, delete = self._ops(kind)
        try:
            self.writes += 1
            await delete(name, namespace, propagation_policy=propagation)
            return True
        except ApiException as error:
            if error.status == 404:
                return False
            raise

    async def ensure(
        self, manifest: Manifest, existing: Mapping[str, Any] | None, *, patch: Mapping[str, Any] | None = None
    ) -> None:
        """Apply (server-side) when missing or when the template hash moved, so a field dropped from the
        template is dropped from the object too; else merge-patch `patch` (the replica count) when it differs.
        The running template is only ever replaced whole: a Job's pod template is immutable, and the server's
        is kept while it holds its GPUs (k8s/reconcile.py)."""
        meta = manifest["metadata"]
        wanted_hash = annotation(manifest, TEMPLATE_HASH)
        have_hash = annotation(existing, TEMPLATE_HASH)
        if existing is None or (wanted_hash is not None and wanted_hash != have_hash):
            await self.apply(manifest)
        elif patch and not _contains(existing, patch):
            await self.patch(manifest["kind"], meta["namespace"], meta["name"], patch)

    async def events_about(self, namespace: str, uid: str) -> list[Mapping[str, Any]]:
        """Events whose involved object is `uid` (a controller's FailedCreate holds the API server's refusal)."""
        listed = await self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}")
        items: list[Mapping[str, Any]] = self._plain(listed).get("items") or []
        return items

    async def kueue_workloads(self, namespace: str) -> list[Mapping[str, Any]]:
        """Kueue's Workloads in `namespace`: the server's (owned by its StatefulSet or LeaderWorkerSet) and the Jobs'
        (labelled kueue.x-k8s.io/job-uid), one list call for both.
        Raises ApiException: 404 where Kueue is not installed, 403 where the operator may not read them."""
        group, version = KUEUE_API_VERSION.split("/")
        listed = await self.custom.list_namespaced_custom_object(group, version, namespace, "workloads")
        items: list[Mapping[str, Any]] = listed.get("items") or []
        return items

    async def kueue_workloads_of_job(self, job_uid: str) -> list[Mapping[str, Any]]:
        """Kueue's Workloads of one job (its kueue.x-k8s.io/job-uid label), in every namespace.
        Raises ApiException as `kueue_workloads`."""
        group, version = KUEUE_API_VERSION.split("/")
        selector = f"{KUEUE_JOB_UID_LABEL}={job_uid}"
        listed = await self.custom.list_cluster_custom_object(group, version, "workloads", label_selector=selector)
        items: list[Mapping[str, Any]] = listed.get("items") or []
        return items

    async def activate_workload(self, namespace: str, name: str, active: bool) -> None:
        """A Workload's spec.active, merge-patched: False makes Kueue evict it (reason Deactivated) and suspend its
        Job, True queues it again."""
        group, version = KUEUE_API_VERSION.split("/")
        self.writes += 1
        await self.custom.patch_namespaced_custom_object(
            group,
            version,
            namespace,
            "workloads",
            name,
            {"spec": {"active": active}},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # the generated client takes it in **kwargs
        )

    async def kueue_cluster_queue(self, namespace: str, local_queue: str) -> str | None:
        """The ClusterQueue a LocalQueue feeds (its spec.clusterQueue); None when the LocalQueue does not exist."""
        group, version = KUEUE_API_VERSION.split("/")
        try:
            queue = await self.custom.get_namespaced_custom_object(
                group, version, namespace, "localqueues", local_queue
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        found: str | None = (queue.get("spec") or {}).get("clusterQueue")
        return found

    async def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, *, component: str, instance: str
    ) -> None:
        """A core/v1 Event about `involved` (an object reference), from `component` (kubectl describe's "From").
        Raises ApiException; the caller decides what a refused event means (events are auxiliary)."""
        stamp = datetime.now(UTC)
        namespace = involved["namespace"]
        body: Any = {  # a plain dict, as every body here (the client serializes it as it is)
            "metadata": {"generateName": f"{component}-", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type_,
            "reason": reason,
            "message": message,
            "action": "Reconcile",
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": instance,
            "count": 1,
            "firstTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "eventTime": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        await self.core.create_namespaced_event(namespace, body)

    async def takes_new_content(self, namespace: str) -> bool:
        """Whether the namespace accepts new objects: False once it is being deleted (or gone). Asked with a
        dry-run create, which the API server's NamespaceLifecycle admission answers without storing anything."""
        probe: Any = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "datagen-probe-"}}
        try:
            await self.core.create_namespaced_config_map(namespace, probe, dry_run="All")
        except ApiException as error:
            if namespace_terminating(error) or error.status == 404:
                return False
            raise
        return True

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.writes += 1
        await self.custom.patch_namespaced_custom_object_status(
            API_GROUP,
            API_VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]  # the generated client takes it in **kwargs
        )


REFUSED = frozenset({400, 403, 422})
"""Invalid (422), bad request (400), forbidden by a quota, admission or RBAC (403): the same write fails again
until someone changes something. Anything else (conflicts, timeouts, 5xx) is worth a plain retry."""


def refusal(error: ApiException) -> str | None:
    """The API server's own words when it refuses a write, else None."""
    if error.status not in REFUSED:
        return None
    try:
        return str(json.loads(error.body or b"").get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(error.body or error.reason)


NAMESPACE_TERMINATING = "NamespaceTerminating"
"""The cause the API server gives when it refuses new content in a namespace that is being deleted."""


def namespace_terminating(error: ApiException) -> bool:
    """A 403 'unable to create new content in namespace X because it is being terminated'."""
    if error.status != 403:
        return False
    try:
        details = json.loads(error.body or b"").get("details") or {}
    except (TypeError, ValueError, AttributeError):
        return False
    return any(cause.get("reason") == NAMESPACE_TERMINATING for cause in details.get("causes") or [])


def drifted(wanted: Mapping[str, Any], existing: Mapping[str, Any] | None) -> bool:
    """A child is missing, or a field the operator sets reads otherwise (a hand edit). Fields the API server
    fills in (defaults, status) and fields others add are not drift."""
    return existing is None or not _contains(existing, wanted)


def _contains(obj: Any, subset: Any) -> bool:
    if isinstance(subset, Mapping):
        return isinstance(obj, Mapping) and all(_contains(obj.get(k), v) for k, v in subset.items())
    if isinstance(subset, list):
        # Lists compare item by item: the server adds defaults inside items (a Service port's protocol).
        return isinstance(obj, list) and len(obj) == len(subset) and all(map(_contains, obj, subset))
    return bool(obj == subset)
