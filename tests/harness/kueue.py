"""The real Kueue controller (sigs.k8s.io/kueue) in the test control plane.

hack/testbin/build.sh builds `kueue-manager` and copies the module's CRDs and webhook manifests into
`<testbin>/kueue/`. As LWS, the manager runs as a local process with its internal certificate management
off, serving its webhooks on loopback with a certificate from the harness's CA
(tests/harness/webhook_manager.py).
With that setting v0.17.0 also reads a metrics certificate from a fixed path under /etc; build.sh's one
patch lets `KUEUE_METRICS_CERT_PATH` name another folder, and the harness gives it the serving one.

Kueue is confined to the namespaces labelled `KUEUE_NAMESPACE_LABEL`: its workload webhooks (Job, Pod,
StatefulSet, LeaderWorkerSet) select only those namespaces, so the other tests of a session that started it
never meet it. There it manages what carries a queue label. Kueue also manages every Job *without* one
(`manageJobsWithoutQueueName: true`), but only in the namespaces its `managedJobsNamespaceSelector` selects:
those that also carry `KUEUE_ALL_JOBS_LABEL` (fixture `kueue_all_jobs_namespace`), a namespace as a cluster
whose Kueue manages all Jobs has them. Feature gate `ManagedJobsNamespaceSelectorAlwaysRespected` (Beta, on by
default in v0.17) is off: with it on, a labelled object outside the selector would not be managed at all.
See docs/kueue.md for what the operator relies on.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.pki import CertificateAuthority
from tests.harness.processes import wait_until
from tests.harness.webhook_manager import WebhookManager

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/v1beta2"
# A namespace carrying this label is one Kueue manages (its workload webhooks and its controllers).
KUEUE_NAMESPACE_LABEL = ("datagen.dev/kueue", "managed")
# A namespace carrying this label as well is one where Kueue manages every Job, labelled or not (and every pod,
# StatefulSet and LeaderWorkerSet without a queue label): its `managedJobsNamespaceSelector`.
KUEUE_ALL_JOBS_LABEL = ("datagen.dev/kueue-jobs", "all")
# The integrations the operator's children need: its CPU Jobs, the single-node server's StatefulSet,
# the multi-node server's LeaderWorkerSet; `pod` is what the last two are built on (pod groups).
FRAMEWORKS = ("batch/job", "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")
# Webhook paths kept from the module's manifests: Kueue's own objects and the integrations above.
_KEPT_PATH_PARTS = ("-kueue-x-k8s-io-", "-batch-v1-job", "--v1-pod", "-apps-v1-statefulset", "-leaderworkerset-")
_WORKLOAD_PATH_PARTS = _KEPT_PATH_PARTS[1:]


@dataclass(frozen=True)
class KueueManifests:
    """The files build.sh copies from the module: every CRD in one file, the webhook configurations."""

    directory: Path

    def crds(self) -> list[dict[str, Any]]:
        """Each CRD with its storage version (v1beta2) alone: the v1beta1 twin would need Kueue's
        conversion webhook, which nothing here calls."""
        crds = []
        for document in yaml.safe_load_all((self.directory / "crds.yaml").read_text()):
            if not document:
                continue
            document["spec"]["versions"] = [v for v in document["spec"]["versions"] if v.get("storage")]
            document["spec"].pop("conversion", None)
            crds.append(document)
        return crds

    def webhook_configurations(self, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
        """The Mutating- and ValidatingWebhookConfiguration, cut to the kept webhooks, the workload
        ones limited to labelled namespaces, each pointed at `base_url` + its path."""
        key, value = KUEUE_NAMESPACE_LABEL
        configurations = []
        for document in yaml.safe_load_all((self.directory / "webhooks.yaml").read_text()):
            if not document:
                continue
            webhooks = []
            for webhook in document["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                if not any(part in path for part in _KEPT_PATH_PARTS):
                    continue
                webhook["clientConfig"] = {"url": f"{base_url}{path}", "caBundle": base64.b64encode(ca_pem).decode()}
                if any(part in path for part in _WORKLOAD_PATH_PARTS):
                    webhook["namespaceSelector"] = {"matchLabels": {key: value}}
                webhooks.append(webhook)
            configurations.append(
                {**document, "metadata": {"name": f"kueue-{document['metadata']['name']}"}, "webhooks": webhooks}
            )
        return configurations


def _config_yaml(webhook_port: int, cert_dir: Path, probe_port: int) -> str:
    # Fields of config.kueue.x-k8s.io/v1beta2 Configuration (apis/config/v1beta2 in the module).
    key, value = KUEUE_ALL_JOBS_LABEL
    return yaml.safe_dump(
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
            # Every Job without a queue label is managed, in the namespaces labelled KUEUE_ALL_JOBS_LABEL only
            # (jobframework/defaults.go WorkloadShouldBeSuspended, reconciler.go): elsewhere, as with false.
            "manageJobsWithoutQueueName": True,
            "managedJobsNamespaceSelector": {"matchLabels": {key: value}},
            "integrations": {"frameworks": list(FRAMEWORKS)},
            # On-demand visibility is an aggregated API server of its own; nothing here reads it.
            # ManagedJobsNamespaceSelectorAlwaysRespected on would stop Kueue managing a labelled object in a
            # namespace outside managedJobsNamespaceSelector (jobframework/reconciler.go): every test namespace
            # labelled KUEUE_NAMESPACE_LABEL alone would lose its queues.
            "featureGates": {"VisibilityOnDemand": False, "ManagedJobsNamespaceSelectorAlwaysRespected": False},
        },
        sort_keys=False,
    )


def probe_resource_flavor(name: str) -> dict[str, Any]:
    """A ResourceFlavor, for a server-side dry run that passes Kueue's own webhooks."""
    return {"apiVersion": KUEUE_API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name}}


def kueue_manager(
    ca: CertificateAuthority, directory: Path, install: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None]
) -> WebhookManager:
    """kueue-manager, with the files build.sh copied into `directory`: its CRDs and webhook configurations go in
    through `install(crds, webhooks)`; ready once a ResourceFlavor dry run passes its webhooks."""
    manifests = KueueManifests(directory)
    return WebhookManager(
        "kueue",
        _config_yaml,
        lambda url: install(manifests.crds(), manifests.webhook_configurations(url, ca.pair.cert_pem())),
        probe_resource_flavor("harness-probe"),
        ready_timeout=90,
        # Its metrics certificate (metrics are off, but v0.17.0 reads one): the serving one, through the
        # environment variable hack/testbin/build.sh's one patch adds.
        env=lambda cert_dir: {"KUEUE_METRICS_CERT_PATH": str(cert_dir)},
    )


def _active(obj: dict[str, Any]) -> bool:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Active"]
    return bool(found) and found[0]["status"] == "True"


@contextlib.contextmanager
def gpu_cluster_queue(
    cluster: Any,
    namespace: str,
    quota: list[dict[str, str]],
    covered: list[str],
    local_queue: str = "gpus",
    preemption: dict[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """(ClusterQueue, LocalQueue `local_queue` in `namespace`): one flavor with `quota`, Active before it is
    given; the cluster-scoped objects are removed afterwards (the namespace's deletion takes the LocalQueue).
    `preemption`: the ClusterQueue's spec.preemption, e.g. {"withinClusterQueue": "LowerPriority"} (Kueue's
    default, Never, preempts nothing)."""
    suffix = f"{local_queue}-{namespace.rsplit('-', 1)[-1]}"
    flavor, cluster_queue = f"gpu-{suffix}", f"cq-{suffix}"
    flavors = cluster.resource(KUEUE_API_VERSION, "ResourceFlavor")
    cluster_queues = cluster.resource(KUEUE_API_VERSION, "ClusterQueue")
    local_queues = cluster.resource(KUEUE_API_VERSION, "LocalQueue")
    flavors.create(body={"apiVersion": KUEUE_API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor}})
    cluster_queues.create(
        body={
            "apiVersion": KUEUE_API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": covered, "flavors": [{"name": flavor, "resources": quota}]}],
                **({"preemption": preemption} if preemption else {}),
            },
        }
    )
    local_queues.create(
        namespace=namespace,
        body={
            "apiVersion": KUEUE_API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue},
            "spec": {"clusterQueue": cluster_queue},
        },
    )
    wait_until(
        lambda: _active(cluster_queues.get(name=cluster_queue).to_dict()),
        timeout=30,
        describe=f"ClusterQueue {cluster_queue} Active",
    )
    try:
        yield cluster_queue, local_queue
    finally:
        # The ClusterQueue keeps a finalizer while it has workloads: it goes with the namespace's.
        cluster_queues.delete(name=cluster_queue)
        flavors.delete(name=flavor)


PRIORITY_CLASSES = {"low": 100, "high": 1000}
"""The WorkloadPriorityClasses `workload_priority_classes` makes, by suffix: a higher value preempts a lower one
in a ClusterQueue whose preemption allows it."""


@contextlib.contextmanager
def workload_priority_classes(cluster: Any, namespace: str) -> Iterator[dict[str, str]]:
    """Kueue's cluster-scoped WorkloadPriorityClasses low (100) and high (1000), named for the test's namespace
    ({"low": name, "high": name}: the run's spec.queue.priorityClass), removed afterwards."""
    classes = cluster.resource(KUEUE_API_VERSION, "WorkloadPriorityClass")
    suffix = namespace.rsplit("-", 1)[-1]
    names = {level: f"{level}-{suffix}" for level in PRIORITY_CLASSES}
    for level, value in PRIORITY_CLASSES.items():
        classes.create(
            body={
                "apiVersion": KUEUE_API_VERSION,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": names[level]},
                "value": value,
                "description": f"datagen tests: {level}",
            }
        )
    try:
        yield names
    finally:
        for name in names.values():
            classes.delete(name=name)


def kueue_state(cluster: Any, namespace: str, server_selector: str) -> str:
    """The Workloads, server pods and StatefulSets of `namespace` as Kueue left them, for a failure's message."""
    lines = []
    for workload in cluster.resource(KUEUE_API_VERSION, "Workload").get(namespace=namespace).items:
        w = workload.to_dict()
        conditions = [
            (c["type"], c["status"], c.get("reason"), c.get("message"))
            for c in (w.get("status") or {}).get("conditions") or []
        ]
        lines.append(
            f"workload {w['metadata']['name']} owners={[o['name'] for o in w['metadata'].get('ownerReferences') or []]} "
            f"finalizers={w['metadata'].get('finalizers')} deleting={w['metadata'].get('deletionTimestamp')} "
            f"priority={(w.get('spec') or {}).get('priority')} {conditions}"
        )
    for pod in cluster.resource("v1", "Pod").get(namespace=namespace, label_selector=server_selector).items:
        p = pod.to_dict()
        lines.append(
            f"pod {p['metadata']['name']} uid={p['metadata']['uid'][:8]} labels={p['metadata'].get('labels')} "
            f"gates={(p.get('spec') or {}).get('schedulingGates')} finalizers={p['metadata'].get('finalizers')} "
            f"deleting={p['metadata'].get('deletionTimestamp')} phase={(p.get('status') or {}).get('phase')}"
        )
    for sts in cluster.resource("apps/v1", "StatefulSet").get(namespace=namespace).items:
        st = sts.to_dict()
        lines.append(
            f"sts {st['metadata']['name']} replicas={st['spec'].get('replicas')} labels={st['metadata'].get('labels')}"
        )
    return "\n".join(lines)
