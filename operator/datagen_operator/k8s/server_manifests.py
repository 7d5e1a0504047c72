"""The SGLang server a run owns: its URLs, its Services, its probes, and the StatefulSet (one node per server) or
LeaderWorkerSet (a group of nodes per server). Pure."""

from __future__ import annotations

import math
from typing import Any

from datagen_operator.api.extra_args import extra_arg_value
from datagen_operator.api.names import (
    Component,
    server_name,
    server_pod_name,
)
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.engine.health import (
    HEALTH_ANSWER_TIMEOUT_S,
    WATCHDOG_FLAG,
    WATCHDOG_TIMEOUT_S,
    liveness_failure_threshold,
)
from datagen_operator.engine.launch import server_argv
from datagen_operator.k8s.object_meta import (
    LWS_API_VERSION,
    LWS_KIND,
    TEMPLATE_HASH,
    Manifest,
    RunRef,
    kueue_labels,
    labels,
    object_metadata,
    selector,
    template_hash,
)
from datagen_operator.k8s.pod_parts import (
    env_vars,
    model_volume,
    no_privileges,
    server_pod_security,
    server_resources,
)

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


def headless_service(run: RunRef, spec: DataGenRunSpec) -> Manifest:
    """Governs the StatefulSet (stable pod DNS) and lists every ready replica."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(run, server_name(run.name), Component.SERVER),
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
        "metadata": object_metadata(run, pod, Component.SERVER),
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
    model_volumes, model_mounts = model_volume(spec)
    startup_failures = math.ceil(STARTUP_PROBE_BACKSTOP_S / STARTUP_PERIOD_S)
    container: dict[str, Any] = {
        "name": str(Component.SERVER),
        "image": server.image,
        # With nodes > 1 the same argv on every pod; `$(LWS_...)` is expanded by the kubelet per pod.
        "command": server_argv(spec, host="0.0.0.0", resolved=resolved),
        "ports": [{"name": "http", "containerPort": server.port}],
        "resources": server_resources(spec),
        "securityContext": no_privileges(read_only_root=False),  # JIT kernel caches write into the image
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


def _server_meta(run: RunRef, spec: DataGenRunSpec, template_digest: str) -> dict[str, Any]:
    meta = object_metadata(run, server_name(run.name), Component.SERVER, {TEMPLATE_HASH: template_digest})
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
