"""Pure builders: the Kubernetes objects of one run, as dicts, from its spec and names. No I/O here.

Every object carries the run's labels and a controller ownerReference to the DataGenRun, so the
garbage collector removes them with the run and a restarted operator finds them again by name.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from datagen_operator.api.commands import (
    CanaryCommand,
    Command,
    ExportCommand,
    PreflightCommand,
    ReleaseLeaseCommand,
    VerifyCommand,
    WorkerCommand,
)
from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT, WORKER_GRACE_S
from datagen_operator.api.extra_args import extra_arg_value
from datagen_operator.api.names import (
    Component,
    canary_job_name,
    export_job_name,
    preflight_job_name,
    release_job_name,
    server_name,
    server_pod_name,
    shard_configmap_name,
    spec_configmap_name,
    verify_job_name,
    worker_account_name,
    workers_job_name,
)
from datagen_operator.api.output_files import CANARY_RECORDS
from datagen_operator.api.paths import DATASET_MOUNT, OUTPUT_MOUNT, dataset_file, export_dir, output_dir
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import (
    API_GROUP,
    API_GROUP_VERSION,
    AUTO_CONCURRENCY,
    KIND,
    DataGenRunSpec,
    EnvVar,
    VolumeSource,
)
from datagen_operator.control.policy import FREE_EXITS, PERMANENT_EXITS, SHARD_RETRIES
from datagen_operator.engine.health import (
    HEALTH_ANSWER_TIMEOUT_S,
    WATCHDOG_FLAG,
    WATCHDOG_TIMEOUT_S,
    liveness_failure_threshold,
)
from datagen_operator.engine.launch import server_argv

Manifest = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = "datagen-operator"
RUN_LABEL = f"{API_GROUP}/run"
COMPONENT_LABEL = f"{API_GROUP}/component"
TEMPLATE_HASH = f"{API_GROUP}/template-hash"
DATA_GENERATION = f"{API_GROUP}/data-generation"
SPEC_CHANGED_GENERATION = f"{API_GROUP}/spec-changed-generation"
"""On the spec ConfigMap: control.children.SpecInForce.changed_generation (the last change beyond spec.suspend)."""
"""On the spec ConfigMap: the run generation whose data-affecting fields are applied (outcomes older are stale)."""
SERVER_URLS = f"{API_GROUP}/server-urls"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
"""The Kueue API the operator reads (Workloads, LocalQueues): v0.17's storage version (docs/kueue.md)."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""On the Workload Kueue makes for a Job: the Job's uid (the operator finds a Job's Workload by it)."""
"""A server over several nodes (sigs.k8s.io/lws, which must be installed in the cluster)."""

RUN_FILE_DIR = "/etc/datagen"
RUN_FILE = f"{RUN_FILE_DIR}/run.yaml"
TERMINATION_LOG = "/dev/termination-log"

# --- security: every pod the operator creates -----------------------------------------------------
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

STARTUP_PERIOD_S = 10
STARTUP_PROBE_BACKSTOP_S = 7 * 24 * 3600
"""The kubelet's startup budget, a backstop for when the operator is gone. server.startupTimeout is enforced
by the operator (it halts the run and releases the GPUs), so it stays out of the pod template: raising it
during a load takes effect at once, and a load is never cut short by a kubelet restart (another load)."""
PROBE_TIMEOUT_S = math.ceil(HEALTH_ANSWER_TIMEOUT_S)
"""SGLang's health call takes a second at least and answers 503 itself after 20 s without scheduler output
(engine/health.py): the kubelet waits for that verdict rather than cutting a slow-but-working server short."""
READINESS_PERIOD_S = 10
LIVENESS_PERIOD_S = 30


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


# --- names: the run's child names are api/names.py (the run-name limit is computed from them) ---


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


def _meta(run: RunRef, name: str, component: Component, annotations: dict[str, str] | None = None) -> dict[str, Any]:
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


# --- the applied spec (which fields may change once bulk records exist: api/live_fields.py) -------


def spec_document(spec: DataGenRunSpec) -> dict[str, Any]:
    """The spec as normalized JSON (defaults filled in), so comparisons ignore spelling."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def external_urls(namespace: str, spec: DataGenRunSpec) -> list[str] | None:
    """server.external's URLs (a Service as its cluster DNS name), or None for a server the run owns."""
    external = spec.server.external
    if external is None:
        return None
    if external.urls is not None:
        return [url.rstrip("/") for url in external.urls]
    assert external.service is not None
    service = external.service
    return [f"http://{service.name}.{service.namespace or namespace}.svc:{service.port}"]


def server_urls(run: str, namespace: str, spec: DataGenRunSpec, override: tuple[str, ...] = ()) -> list[str]:
    """One URL per replica: its own Service's DNS name, or (tests only) the operator's override; server.external's
    own URLs as written (the override stands in for the run's own server pods only)."""
    external = external_urls(namespace, spec)
    if external is not None:
        return external
    replicas = spec.server.replicas
    if override:
        # {namespace} and {pod} let one loopback router stand in for every server pod (hack/dev-cluster.py).
        return [
            override[i % len(override)].replace("{namespace}", namespace).replace("{pod}", server_pod_name(run, i))
            for i in range(replicas)
        ]
    return [f"http://{server_pod_name(run, i)}.{namespace}.svc:{spec.server.port}" for i in range(replicas)]


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


def _model_volume(spec: DataGenRunSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if spec.model.volume is None:
        return [], []
    volume = {"name": "model", **volume_source(spec.model.volume, read_only=True)}
    mount: dict[str, Any] = {"name": "model", "mountPath": spec.model.path, "readOnly": True}
    if spec.model.sub_path:
        mount["subPath"] = spec.model.sub_path  # one shared models volume, one folder per model
    return [volume], [mount]


def _data_volumes(
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


def _run_file_volume(run: str) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _no_privileges(*, read_only_root: bool) -> dict[str, Any]:
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
        "metadata": _meta(run, spec_configmap_name(run.name), Component.SPEC, generations),
        "data": {"run.yaml": text},
    }


def shard_configmap(run: RunRef, index: int) -> Manifest:
    """Pre-created so the worker only needs get/patch on its own name (it writes data['progress.json'])."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(run, shard_configmap_name(run.name, index), Component.PROGRESS),
    }


def worker_service_account(run: RunRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(run, worker_account_name(run.name), Component.WORKER),
        "automountServiceAccountToken": False,  # only the worker pods mount a token, by their own choice
    }


def worker_role(run: RunRef, shards: int) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(run, worker_account_name(run.name), Component.WORKER),
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
        "metadata": _meta(run, name, Component.WORKER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": run.namespace}],
    }


def headless_service(run: RunRef, spec: DataGenRunSpec) -> Manifest:
    """Governs the StatefulSet (stable pod DNS) and lists every ready replica."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(run, server_name(run.name), Component.SERVER),
        "spec": {
            "clusterIP": "None",
            "selector": selector(run.name, Component.SERVER),
            "ports": [{"name": "http", "port": spec.server.port, "targetPort": "http"}],
        },
    }


def replica_service(run: RunRef, spec: DataGenRunSpec, index: int) -> Manifest:
    """One Service per server pod: workers spread requests over replicas themselves (per-replica URLs)."""
    pod = server_pod_name(run.name, index)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(run, pod, Component.SERVER),
        "spec": {
            "selector": {"statefulset.kubernetes.io/pod-name": pod},
            "ports": [{"name": "http", "port": spec.server.port, "targetPort": "http"}],
        },
    }


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _liveness_failures(spec: DataGenRunSpec) -> int:
    """A stall SGLang's own watchdog still tolerates (--watchdog-timeout, server.extraArgs may raise it) never
    restarts the server, which would cost a model load; a hung process is ended by that watchdog, or by the
    kubelet soon after."""
    given = extra_arg_value(spec.server.extra_args, WATCHDOG_FLAG)
    try:
        watchdog_s = float(given) if given is not None else WATCHDOG_TIMEOUT_S
    except ValueError:  # refused by SGLang's own parser at launch, which says so
        watchdog_s = WATCHDOG_TIMEOUT_S
    return liveness_failure_threshold(LIVENESS_PERIOD_S, watchdog_s)


def _server_pod_template(
    run: RunRef, spec: DataGenRunSpec, *, serves_api: bool, resolved: ResolvedModel | None = None
) -> dict[str, Any]:
    """A server pod. `serves_api`: it answers the HTTP API (a single-node server, or a group's leader);
    otherwise it is a group's worker, where SGLang serves only a health endpoint (always 200 once its
    schedulers run, i.e. after the weights loaded), so it gets startup and liveness checks, no readiness."""
    server = spec.server
    model_volumes, model_mounts = _model_volume(spec)
    startup_failures = math.ceil(STARTUP_PROBE_BACKSTOP_S / STARTUP_PERIOD_S)
    container: dict[str, Any] = {
        "name": str(Component.SERVER),
        "image": server.image,
        # With nodes > 1 the same argv on every pod; `$(LWS_...)` is expanded by the kubelet per pod.
        "command": server_argv(spec, host="0.0.0.0", resolved=resolved),
        "ports": [{"name": "http", "containerPort": server.port}],
        "resources": server_resources(spec),
        "securityContext": _no_privileges(read_only_root=False),  # JIT kernel caches write into the image
        "volumeMounts": [*model_mounts, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if serves_api:
        # No fixed initial delay: the startup probe gates the others while the model loads.
        container["startupProbe"] = _probe("/health_generate", STARTUP_PERIOD_S, PROBE_TIMEOUT_S, startup_failures)
        container["readinessProbe"] = _probe("/health_generate", READINESS_PERIOD_S, PROBE_TIMEOUT_S, 3)
    else:
        container["startupProbe"] = _probe("/health", STARTUP_PERIOD_S, PROBE_TIMEOUT_S, startup_failures)
    container["livenessProbe"] = _probe("/health", LIVENESS_PERIOD_S, PROBE_TIMEOUT_S, _liveness_failures(spec))
    if server.env:
        container["env"] = env_vars(server.env)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the server never talks to the API server
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": server_pod_security(),
        "containers": [container],
        "volumes": [
            *model_volumes,
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": server.shm_size}},
        ],
    }
    if server.node_selector:
        pod_spec["nodeSelector"] = dict(server.node_selector)
    if server.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in server.tolerations
        ]
    if server.affinity:
        pod_spec["affinity"] = dict(server.affinity)
    if server.priority_class_name:
        pod_spec["priorityClassName"] = server.priority_class_name
    if server.runtime_class_name:
        pod_spec["runtimeClassName"] = server.runtime_class_name
    return {"metadata": {"labels": labels(run.name, Component.SERVER)}, Component.SPEC: pod_spec}


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


def _server_meta(run: RunRef, spec: DataGenRunSpec, template_digest: str) -> dict[str, Any]:
    meta = _meta(run, server_name(run.name), Component.SERVER, {TEMPLATE_HASH: template_digest})
    meta["labels"].update(kueue_labels(spec))
    return meta


def server_statefulset(
    run: RunRef, spec: DataGenRunSpec, replicas: int, resolved: ResolvedModel | None = None
) -> Manifest:
    """The SGLang server of server.nodes == 1: one pod per data-parallel replica, all started at once (Parallel)."""
    template = _server_pod_template(run, spec, serves_api=True, resolved=resolved)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _server_meta(run, spec, template_hash(template)),
        "spec": {
            "serviceName": server_name(run.name),
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(run.name, Component.SERVER)},
            "template": template,
        },
    }


def server_leaderworkerset(
    run: RunRef, spec: DataGenRunSpec, replicas: int, resolved: ResolvedModel | None = None
) -> Manifest:
    """The SGLang server of server.nodes > 1: one LeaderWorkerSet group of `nodes` pods per replica.

    LWS names the group's leader <run>-server-<i>, as the StatefulSet names a single-node server, so the
    per-replica Services and URLs are the same; its workers are <run>-server-<i>-<rank>. A group restarts
    whole when any of its pods does (SGLang's ranks cannot rejoin a running server). LWS makes its own
    headless Service <run>-server (publishing not-ready addresses: the workers resolve the leader while
    it loads), so the operator creates none for a group."""
    leader = _server_pod_template(run, spec, serves_api=True, resolved=resolved)
    worker = _server_pod_template(run, spec, serves_api=False, resolved=resolved)
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _server_meta(run, spec, template_hash({"leader": leader, "worker": worker})),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",  # every rank loads at once; the leader waits for the others
            "leaderWorkerTemplate": {
                "size": spec.server.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def server_workload(
    run: RunRef, spec: DataGenRunSpec, replicas: int, resolved: ResolvedModel | None = None
) -> Manifest:
    """The StatefulSet (one node per server) or the LeaderWorkerSet (a group of nodes per server)."""
    if spec.server.nodes > 1:
        return server_leaderworkerset(run, spec, replicas, resolved)
    return server_statefulset(run, spec, replicas, resolved)


RESTART_HASH = f"{API_GROUP}/restart-hash"
ADMISSION_HASH = f"{API_GROUP}/admission-hash"
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


def _job(
    run: RunRef,
    spec: DataGenRunSpec,
    name: str,
    component: Component,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    job_spec: dict[str, Any],
    *,
    service_account: str | None = None,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a podFailurePolicy needs it; the Job makes a new pod instead
        "enableServiceLinks": False,
        "automountServiceAccountToken": service_account is not None,
        "securityContext": datagen_pod_security(),
        "containers": [container],
        "volumes": [*volumes, {"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}}],
        **client_placement(spec),
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    template = {"metadata": {"labels": labels(run.name, component)}, "spec": pod_spec}
    meta_annotations = {TEMPLATE_HASH: template_hash(template), **(annotations or {})}
    meta = _meta(run, name, component, meta_annotations)
    # Queued as the server is: where Kueue manages Jobs, every Job of the run waits in the same LocalQueue
    # (docs/kueue.md, "The run's CPU Jobs").
    meta["labels"].update(kueue_labels(spec))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {**job_spec, "template": template}}


def started_worker_image(
    recorded: str | None, jobs: Iterable[Mapping[str, Any]], spec_image: str | None, operator_image: str
) -> str:
    """The operator's worker image a run started with, which all its pods keep (status.workerImage): an
    operator upgrade mid-run must not leave workers on one image and verify on another. `recorded` in the
    run's first status write, before any child; for a run whose status was lost (restored without it), the
    image of its first Job (unless that was spec.clients.image's, which says nothing of the operator's);
    else, for a new run, the operator's now."""
    if recorded:
        return recorded
    first = min(jobs, key=lambda job: str(job["metadata"].get("creationTimestamp") or ""), default=None)
    if first is not None and not spec_image:
        containers = ((first.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if containers and containers[0].get("image"):
            return str(containers[0]["image"])
    return operator_image


def _datagen_container(
    name: Component, image: str, command: Command, mounts: list[dict[str, Any]], spec: DataGenRunSpec
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": str(name),
        "image": image,
        "command": ["datagen", *command.argv()],
        "env": [{"name": "HOME", "value": SCRATCH_HOME}, {"name": "TMPDIR", "value": SCRATCH_HOME}],
        "terminationMessagePath": TERMINATION_LOG,
        # The verdict file when the program wrote one; else the log's tail (a crash explains itself).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _no_privileges(read_only_root=True),
        "volumeMounts": [*mounts, {"name": "scratch", "mountPath": SCRATCH_HOME}],
    }
    resources = client_resources(spec.clients.cpu, spec.clients.memory)
    if resources:
        container["resources"] = resources
    return container


def _on_exit(action: str, container: Component, codes: list[int]) -> dict[str, Any]:
    """A podFailurePolicy rule: what the Job controller does when `container` exits with one of `codes`."""
    return {"action": action, "onExitCodes": {"containerName": str(container), "operator": "In", "values": codes}}


IGNORE_DISRUPTION = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
"""A pod evicted, preempted or drained off its node is no failure of its own: it spends no retry."""
STEP_RETRIES = 2
"""Retries of a crashed step pod: each step is safe to run again (release-lease is idempotent)."""


def step_failure_policy(container: Component) -> dict[str, Any]:
    """The one failure policy of every step Job: a disruption is free, a written verdict that did not pass fails
    it at once (running it again gives the same verdict), any other exit (a crash, EXIT_STEP_CRASHED) is retried
    STEP_RETRIES times. The first rule that matches decides: an evicted pod whose program exited 1 on its SIGTERM
    is still an eviction, never a verdict. release-lease writes no verdict, so for it every failure is a crash."""
    verdict = _on_exit("FailJob", container, [EXIT_FAILED_VERDICT])
    return {"backoffLimit": STEP_RETRIES, "podFailurePolicy": {"rules": [IGNORE_DISRUPTION, verdict]}}


RELEASE_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
"""A lease file removed: far below what spec.clients asks for the workers."""


@dataclass(frozen=True)
class StepJob:
    """What one step Job has of its own; the pod, its volumes and the failure policy are every step's."""

    name: Callable[[str], str]
    reads_run: bool = True
    """The run file and the model volume (the tokenizer) mounted: every step but release-lease, which only
    removes the lease file from the output."""
    output_writable: bool = True
    resources: Mapping[str, Any] | None = None
    """None: spec.clients' cpu and memory, as every CPU pod of the run."""


STEP_JOBS: dict[Component, StepJob] = {
    # Writes the dataset's pin into the output and takes its lease.
    Component.PREFLIGHT: StepJob(preflight_job_name),
    # The canary's records stay with the data, passed or failed.
    Component.CANARY: StepJob(canary_job_name),
    Component.VERIFY: StepJob(verify_job_name, output_writable=False),
    Component.EXPORT: StepJob(export_job_name),
    Component.RELEASE: StepJob(release_job_name, reads_run=False, resources=RELEASE_RESOURCES),
}
"""The step Jobs, one row each: where they differ. The dataset volume is mounted when the command names the
dataset; the verdict comes back as the container's termination message."""


def _step_job(
    run: RunRef,
    spec: DataGenRunSpec,
    image: str,
    component: Component,
    command: Command,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    step = STEP_JOBS[component]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if step.reads_run:
        run_volume, run_mount = _run_file_volume(run.name)
        model_volumes, model_mounts = _model_volume(spec)  # at model.path: the tokenizer is where the spec says
        volumes += [run_volume, *model_volumes]
        mounts += [run_mount, *model_mounts]
    reads_dataset = getattr(command, "dataset", None) is not None
    data_volumes, data_mounts = _data_volumes(
        spec, dataset=reads_dataset, output=True, output_writable=step.output_writable
    )
    container = _datagen_container(component, image, command, [*mounts, *data_mounts], spec)
    if step.resources is not None:
        container["resources"] = dict(step.resources)
    return _job(
        run,
        spec,
        step.name(run.name),
        component,
        container,
        [*volumes, *data_volumes],
        step_failure_policy(component),
        annotations=annotations,
    )


def preflight_job(run: RunRef, spec: DataGenRunSpec, image: str, data_generation: int) -> Manifest:
    """The inputs checked before the server is created (no GPU): dataset, tokenizer, an existing output's
    fingerprint and records. It writes one thing, the dataset's pin into the output (prompts/pin.py)."""
    command = PreflightCommand(
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        output=output_dir(spec),
        termination_log=TERMINATION_LOG,
        lease_holder=run.uid,
    )
    return _step_job(run, spec, image, Component.PREFLIGHT, command, {DATA_GENERATION: str(data_generation)})


def canary_job(run: RunRef, spec: DataGenRunSpec, image: str, urls: list[str], data_generation: int) -> Manifest:
    """The canary runs in a pod because it needs the tokenizer (model volume) and the dataset volume, which the
    operator does not mount."""
    command = CanaryCommand(
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        servers=tuple(urls),
        records=posixpath.join(output_dir(spec), CANARY_RECORDS),
        termination_log=TERMINATION_LOG,
        output=output_dir(spec),
        lease_holder=run.uid,
    )
    annotations = {DATA_GENERATION: str(data_generation), SERVER_URLS: ",".join(urls)}
    return _step_job(run, spec, image, Component.CANARY, command, annotations)


def workers_job(
    run: RunRef, spec: DataGenRunSpec, image: str, urls: list[str], *, suspend: bool, concurrency: int | None = None
) -> Manifest:
    """An Indexed Job, one index per shard. Outages and drains do not burn retries; bad input fails the index.
    `concurrency`: clients.concurrency auto's number, the canary's (the Job is never re-applied, so a resume
    whose Job is gone gets it again from the remembered canary verdict)."""
    run_volume, run_mount = _run_file_volume(run.name)
    model_volumes, model_mounts = _model_volume(spec)
    data_volumes, data_mounts = _data_volumes(spec, dataset=True, output=True, output_writable=True)
    shards = spec.clients.shards
    # No shard index: each pod's is $JOB_COMPLETION_INDEX (an Indexed Job), the count is spec.clients.shards.
    command = WorkerCommand(
        run=RUN_FILE,
        output=output_dir(spec),
        dataset=dataset_file(spec),
        tokenizer=spec.model.tokenizer_dir,
        servers=tuple(urls),
        progress_configmap=shard_configmap_name(run.name, "$(JOB_COMPLETION_INDEX)"),
        log_format="json",
        termination_log=TERMINATION_LOG,
        lease_holder=run.uid,
        concurrency=concurrency if spec.clients.concurrency == AUTO_CONCURRENCY else None,
    )
    container = _datagen_container(Component.WORKER, image, command, [run_mount, *model_mounts, *data_mounts], spec)
    container["env"].append({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    job_spec = {
        "completionMode": "Indexed",
        "completions": shards,
        "parallelism": shards,
        "backoffLimitPerIndex": SHARD_RETRIES,
        "suspend": suspend,
        "podFailurePolicy": {
            "rules": [
                IGNORE_DISRUPTION,
                _on_exit("Ignore", Component.WORKER, list(FREE_EXITS)),
                _on_exit("FailIndex", Component.WORKER, sorted(PERMANENT_EXITS)),
            ]
        },
    }
    job = _job(
        run,
        spec,
        workers_job_name(run.name),
        Component.WORKER,
        container,
        [run_volume, *model_volumes, *data_volumes],
        job_spec,
        service_account=worker_account_name(run.name),
        annotations={SERVER_URLS: ",".join(urls)},
    )
    # SIGKILL only after the worker's drain and final fsync: a stopped worker ends on its own, files synced.
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = WORKER_GRACE_S
    return job


def verify_job(run: RunRef, spec: DataGenRunSpec, image: str) -> Manifest:
    """`datagen verify` over the whole output, read-only."""
    command = VerifyCommand(
        output=output_dir(spec),
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        json=True,
        termination_log=TERMINATION_LOG,
    )
    return _step_job(run, spec, image, Component.VERIFY, command)


def export_job(run: RunRef, spec: DataGenRunSpec, image: str) -> Manifest:
    """`datagen export --formats` of the verified output into spec.export.path."""
    assert spec.export is not None
    # Whole conversations are read against the dataset's planned turns: the dataset only then.
    whole = spec.export.rows == "conversations" or "conversations" in spec.export.formats
    command = ExportCommand(
        output=output_dir(spec),
        formats=tuple(spec.export.formats),
        out=export_dir(spec),
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        termination_log=TERMINATION_LOG,
        max_length=spec.export.max_length,
        exclude_flags=tuple(spec.export.exclude_flags),
        rows=spec.export.rows,
        rerendered_spans=spec.export.rerendered_spans,
        dataset=dataset_file(spec) if whole else None,
    )
    return _step_job(run, spec, image, Component.EXPORT, command)


def release_job(run: RunRef, spec: DataGenRunSpec, image: str, taken_before: float | None) -> Manifest:
    """`datagen release-lease` on the output: a halted run's lease given back (control/children.py plans it
    once per halt)."""
    command = ReleaseLeaseCommand(output=output_dir(spec), lease_holder=run.uid, taken_before=taken_before)
    return _step_job(run, spec, image, Component.RELEASE, command)
