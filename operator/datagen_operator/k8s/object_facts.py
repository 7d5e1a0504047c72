"""API objects -> control.observed facts (the pure half of observing; k8s/observer.py does the reading). Pure: the
shell lists the objects and probes the server, these functions only read dicts."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from datagen_operator.api.exit_codes import EXIT_OK, EXIT_OUTPUT_VOLUME
from datagen_operator.api.outcome import StepOutcome, cut_text
from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import SHARD_CAUSES, Reason
from datagen_operator.api.spec import API_GROUP, KIND
from datagen_operator.api.words import plural
from datagen_operator.control.observed import (
    KueueEvicted,
    KueueQueued,
    ProgressCounters,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from datagen_operator.control.progress import counters_from_snapshots
from datagen_operator.k8s import object_meta

Obj = Mapping[str, Any]


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def annotation(obj: Obj | None, key: str) -> str | None:
    """An object's annotation `key` (None: no such annotation, or no object)."""
    value = (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def _condition(obj: Obj, type_: str) -> Mapping[str, Any] | None:
    conditions: list[Mapping[str, Any]] = (obj.get("status") or {}).get("conditions") or []
    for condition in conditions:
        if condition.get("type") == type_:
            return condition
    return None


def _container_status(pod: Obj, name: str) -> Mapping[str, Any] | None:
    statuses: list[Mapping[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == name:
            return status
    return None


def pod_verdict(terminated: Mapping[str, Any]) -> StepOutcome | None:
    """The verdict a pod ended with (its termination message, api.outcome's JSON), or None: a crash, whose
    message is a traceback or, with FallbackToLogsOnError, its log's tail."""
    message = (terminated.get("message") or "").strip()
    if not message.startswith("{"):
        return None
    try:
        return StepOutcome.from_storage(message)
    except (orjson.JSONDecodeError, KeyError, ValueError, TypeError):
        return None


def _last_words(text: str) -> str:
    """What a person reads of a pod's unstructured last words: the last line (a traceback's exception, the last
    log line; of a JSON log line its `msg`), kept from its start."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    if last.startswith("{"):
        try:
            body = orjson.loads(last)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and body.get("msg"):
            last = str(body["msg"])
    return cut_text(last, EXIT_WORDS)


EXIT_WORDS = 500
"""Characters of a pod's unstructured last words shown on the run."""


def _exit_text(terminated: Mapping[str, Any]) -> str:
    verdict = pod_verdict(terminated)
    if verdict is not None:
        why = f"{verdict.reason}: {verdict.message}"
    else:
        why = _last_words(terminated.get("message") or terminated.get("reason") or "")
    return f"exit {terminated.get('exitCode')}" + (f": {why}" if why else "")


def replica_index(pod_name: str, statefulset: str) -> int | None:
    match = re.fullmatch(re.escape(statefulset) + r"-(\d+)", pod_name)
    return int(match[1]) if match else None


def server_instance(
    pod: Obj, now: datetime, endpoint: str | None, healthy: bool | None, current: bool
) -> ServerInstance:
    """One server pod. Ready needs the kubelet's readiness AND, when the operator probed it, the server's own
    /health_generate: a probe that lies (or a fake kubelet) cannot make a run proceed on its own."""
    name = pod["metadata"]["name"]
    scheduled = _condition(pod, "PodScheduled")
    unschedulable = scheduled is not None and scheduled.get("status") == "False"
    if unschedulable and (scheduled or {}).get("reason") == "SchedulingGated" and not gated(pod):
        unschedulable = False  # its gates were lifted (Kueue's admission): the scheduler has yet to look at it
    container = _container_status(pod, "server") or {}
    state = container.get("state") or {}
    running = "running" in state
    pod_ready = (_condition(pod, "Ready") or {}).get("status") == "True"
    ready = pod_ready and healthy is not False and current
    waiting = (state.get("waiting") or {}).get("reason")
    terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
    loading = None
    if running and not ready:
        started = parse_time(state["running"].get("startedAt"))
        if started is not None:
            loading = max(0.0, (now - started).total_seconds())
    return ServerInstance(
        name=name,
        scheduled=not unschedulable,
        unschedulable_message=(scheduled or {}).get("message") if unschedulable else None,
        running=running,
        ready=ready,
        restarts=int(container.get("restartCount") or 0),
        waiting_reason=waiting,
        last_exit=_exit_text(terminated) if terminated else None,
        loading_seconds=loading,
        endpoint=endpoint,
    )


def server_observation(
    pods: Iterable[Obj],
    statefulset: Obj | None,
    replicas: int,
    urls: Sequence[str],
    health: Mapping[str, bool],
    now: datetime,
    refused: str | None = None,
) -> ServerObservation:
    """Pods of the current StatefulSet revision, by replica index (leftovers of a scale-down are ignored)."""
    if statefulset is None:
        return ServerObservation(replicas_wanted=replicas)
    sts_name = statefulset["metadata"]["name"]
    revision = (statefulset.get("status") or {}).get("updateRevision")
    instances = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        index = replica_index(pod["metadata"]["name"], sts_name)
        if index is None or index >= replicas or (pod["metadata"].get("deletionTimestamp")):
            continue
        current = revision is None or pod["metadata"].get("labels", {}).get("controller-revision-hash") == revision
        name = pod["metadata"]["name"]
        instances.append(
            server_instance(pod, now, urls[index] if index < len(urls) else None, health.get(name), current)
        )
    return ServerObservation(replicas_wanted=replicas, instances=tuple(instances), refused=refused)


def kueue_queued(workload: Obj, cluster_queue: str | None = None) -> KueueQueued | None:
    """A Kueue Workload (kueue.x-k8s.io/v1beta2) of the server that is not admitted, in Kueue's words; None once
    admitted. `cluster_queue`: the LocalQueue's spec.clusterQueue, for a Workload not admitted anywhere yet."""
    if (_condition(workload, "Admitted") or {}).get("status") == "True":
        return None
    status = workload.get("status") or {}
    reserved = _condition(workload, "QuotaReserved") or {}
    # Quota held but admission checks not passed yet: the Admitted condition says which.
    waiting = (_condition(workload, "Admitted") or {}) if reserved.get("status") == "True" else reserved
    return KueueQueued(
        workload=workload["metadata"]["name"],
        local_queue=(workload.get("spec") or {}).get("queueName") or "",
        cluster_queue=(status.get("admission") or {}).get("clusterQueue") or cluster_queue,
        kueue_reason=waiting.get("reason") or "Pending",
        message=waiting.get("message") or "",
    )


def kueue_local_queue(workload: Obj) -> str | None:
    """The LocalQueue Kueue admits the server by: its queue label, from spec.queue or put on by Kueue's webhook
    from the namespace's `default` LocalQueue; None for a server Kueue does not manage."""
    return ((workload.get("metadata") or {}).get("labels") or {}).get(object_meta.KUEUE_QUEUE_LABEL) or None


def kueue_evicted(workload: Obj, cluster_queue: str | None = None) -> KueueEvicted | None:
    """A Kueue Workload (kueue.x-k8s.io/v1beta2) of the server that Kueue evicted (preempted) and has not admitted
    again, in Kueue's words; None otherwise. Kueue sets Evicted=True (and, for a preemption, Preempted=True) on
    the admitted Workload, deletes its pods, then clears its admission (QuotaReserved=False, reason Pending, the
    eviction's message) and requeues it; only a new quota reservation sets Evicted back to False (Kueue's
    pkg/workload/workload.go `Evict`, `SetQuotaReservation`; docs/kueue.md). An Evicted=True older than the
    last Admitted=True is taken as stale, whatever writes it."""
    evicted = _condition(workload, "Evicted") or {}
    preempted = _condition(workload, "Preempted") or {}
    cause = evicted if evicted.get("status") == "True" else preempted
    if cause.get("status") != "True":
        return None
    admitted = _condition(workload, "Admitted") or {}
    if admitted.get("status") == "True":
        since, then = parse_time(admitted.get("lastTransitionTime")), parse_time(cause.get("lastTransitionTime"))
        if since is not None and then is not None and since > then:
            return None
    status = workload.get("status") or {}
    reserved = _condition(workload, "QuotaReserved") or {}
    message = str(cause.get("message") or "")
    waiting = str(reserved.get("message") or "") if reserved.get("status") == "False" else ""
    return KueueEvicted(
        workload=workload["metadata"]["name"],
        local_queue=(workload.get("spec") or {}).get("queueName") or "",
        cluster_queue=(status.get("admission") or {}).get("clusterQueue") or cluster_queue,
        kueue_reason=str(evicted.get("reason") or "Preempted") if evicted.get("status") == "True" else "Preempted",
        preempted_reason=(str(preempted.get("reason") or "") or None) if preempted.get("status") == "True" else None,
        message=message,
        waiting="" if waiting == message else waiting,
    )


_PREEMPTOR = re.compile(r"to accommodate a workload \(UID: ([^,()\s]+), JobUID: ([^,()\s]+)\)")
"""Kueue's preemption message (pkg/scheduler/preemption `preemptionMessage`): "Preempted to accommodate a workload
(UID: <workload uid>, JobUID: <its job's uid>) due to ...", with UNKNOWN for an id it does not have."""


def preemptor_ids(message: str) -> tuple[str, str] | None:
    """(the preempting Workload's UID, its job's UID) from Kueue's preemption message; None when it names none."""
    found = _PREEMPTOR.search(message)
    if found is None or found[1] == "UNKNOWN":
        return None
    return found[1], found[2]


def owner_run(obj: Obj) -> str | None:
    """'namespace/name' of the DataGenRun that owns `obj` (a server's StatefulSet or LeaderWorkerSet, a Job)."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(API_GROUP + "/"):
            return f"{meta.get('namespace')}/{ref.get('name')}"
    return None


KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate Kueue's pod webhook puts on a managed pod until its Workload is admitted."""


def gated(pod: Obj) -> tuple[str, ...]:
    """The pod's scheduling gates: while it has any, the scheduler ignores it (no node, no GPU)."""
    return tuple(gate.get("name") or "" for gate in (pod.get("spec") or {}).get("schedulingGates") or [])


def kueue_gated(pod: Obj) -> bool:
    """The pod waits behind Kueue's admission gate."""
    return KUEUE_ADMISSION_GATE in gated(pod)


def _event_order(event: Obj) -> tuple[str, int]:
    series = (event.get("series") or {}).get("lastObservedTime")
    when = series or event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or ""
    version = (event.get("metadata") or {}).get("resourceVersion") or "0"
    return str(when), int(version) if version.isdigit() else 0


def creation_refusal(events: Iterable[Obj]) -> str | None:
    """A controller's (StatefulSet, Job) newest pod-creation event, when it is a refusal: the message holds
    the API server's words ('pods "x" is forbidden: exceeded quota: ...'). A later SuccessfulCreate clears it."""
    creations = [e for e in events if e.get("reason") in ("SuccessfulCreate", "FailedCreate")]
    if not creations:
        return None
    newest = max(creations, key=_event_order)
    return str(newest.get("message") or "pod creation refused") if newest["reason"] == "FailedCreate" else None


def statefulset_short(statefulset: Obj, pods: Iterable[Obj]) -> bool:
    """Fewer live pods than replicas: only then is it worth asking why (one events read)."""
    wanted = int((statefulset.get("spec") or {}).get("replicas") or 0)
    return len([p for p in pods if not p["metadata"].get("deletionTimestamp")]) < wanted


def job_without_pods(job: Obj) -> bool:
    """A running, unsuspended Job with no active pod: only then is it worth asking why (one events read)."""
    if job_finished(job) or (job.get("spec") or {}).get("suspend"):
        return False
    return not (job.get("status") or {}).get("active")


def holds_a_node(pods: Iterable[Obj]) -> bool:
    """A server pod bound to a node holds its GPUs and loads (or has loaded) the model: replacing it costs a load."""
    return any((p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp") for p in pods)


def is_group_worker(pod: Obj, server: str) -> bool:
    """A worker pod of a LeaderWorkerSet group (<server>-<i>-<rank>), left when server.nodes went back to 1."""
    return re.fullmatch(re.escape(server) + r"-\d+-\d+", pod["metadata"]["name"]) is not None


def pods_to_probe(pods: Iterable[Obj], statefulset: str, replicas: int) -> list[tuple[str, int]]:
    """Server pods the kubelet calls Ready: the operator then asks the server itself."""
    out = []
    for pod in pods:
        index = replica_index(pod["metadata"]["name"], statefulset)
        if index is not None and index < replicas and (_condition(pod, "Ready") or {}).get("status") == "True":
            out.append((pod["metadata"]["name"], index))
    return sorted(out)


def count_indexes(text: str | None) -> int:
    """Job status index sets like '0-2,5' -> 4."""
    total = 0
    for part in (text or "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


def job_finished(job: Obj) -> str | None:
    """'Complete' or 'Failed' once the Job controller says so."""
    for kind in ("Complete", "Failed"):
        if (_condition(job, kind) or {}).get("status") == "True":
            return kind
    return None


def _terminated(pod: Obj, container: str) -> Mapping[str, Any] | None:
    status = _container_status(pod, container) or {}
    return (status.get("state") or {}).get("terminated")


def workers_observation(job: Obj | None, pods: Iterable[Obj], shards: int) -> WorkersObservation | None:
    if job is None:
        return None
    status = job.get("status") or {}
    done = count_indexes(status.get("completedIndexes"))
    failed = count_indexes(status.get("failedIndexes"))
    finished = job_finished(job)
    message = reason = None
    if failed or finished == "Failed":
        failed = max(failed, 1)
        ended = sorted(
            ((t.get("finishedAt") or "", p["metadata"]["name"], t) for p in pods if (t := _terminated(p, "worker"))),
            key=lambda item: item[:2],
        )
        exits = [(name, t) for _, name, t in ended if t.get("exitCode") not in (None, EXIT_OK)]
        cause = shard_cause([terminated for _, terminated in exits])
        if cause is not None:
            reason, message = cause
        else:
            condition = _condition(job, "Failed") or {}
            texts = [f"{name} {_exit_text(t)}" for name, t in exits[-2:]]
            parts = [condition.get("message") or f"{plural(failed, 'shard')} failed after their retries", *texts]
            message = "; ".join(part for part in parts if part)
    return WorkersObservation(
        shards_total=shards,
        shards_done=done,
        shards_failed=failed,
        active=int(status.get("active") or 0),
        paused=bool((job.get("spec") or {}).get("suspend")),
        failure_message=message,
        failure_reason=reason,
    )


def shard_cause(exits: Sequence[Mapping[str, Any]]) -> tuple[Reason, str] | None:
    """(reason, message) when the last failed worker (`exits` in the order they ended) named its cause
    (api.reasons.SHARD_CAUSES) in its verdict, in its own words; None for a crash or a retried cause before it.
    A worker whose exit 7 came without a readable verdict (its log sat on the full volume) still means the
    volume failed: OutputVolumeFull, as `datagen run` says."""
    if not exits:
        return None
    last = exits[-1]
    verdict = pod_verdict(last)
    if verdict is not None and verdict.reason in SHARD_CAUSES:
        return Reason(verdict.reason), verdict.message
    if last.get("exitCode") == EXIT_OUTPUT_VOLUME:
        return Reason.OUTPUT_VOLUME_FULL, f"the output volume failed ({_exit_text(last)})"
    return None


def job_started_at(job: Obj | None) -> float | None:
    """When the Job's current attempt began (status.startTime; the Job controller resets it on resume)."""
    started = parse_time(((job or {}).get("status") or {}).get("startTime"))
    return started.timestamp() if started is not None else None


def shard_snapshots(configmaps: Iterable[Obj]) -> list[ShardProgress]:
    out = []
    for cm in configmaps:
        text = (cm.get("data") or {}).get("progress.json")
        if not text:
            continue
        try:
            out.append(ShardProgress.from_storage(text))
        except (ValueError, TypeError):
            continue  # a worker writes whole snapshots; anything else is not progress
    return out


def progress_counters(configmaps: Iterable[Obj], workers_job: Obj | None = None) -> ProgressCounters | None:
    """The shards' ConfigMaps summed. With the workers Job, snapshots of workers that started before its
    status.startTime (a previous attempt's, left in the ConfigMaps after a resume) say what was lost then, not now
    (control.progress.stale_events)."""
    snapshots = shard_snapshots(configmaps)
    if not snapshots:
        return None
    return counters_from_snapshots(snapshots, attempt_started_at=job_started_at(workers_job))


def fingerprint(configmaps: Iterable[Obj]) -> str | None:
    """The data fingerprint, when the workers publish it with their progress (key `fingerprint_sha256`)."""
    prints = {s.fingerprint_sha256 for s in shard_snapshots(configmaps)} - {""}
    return sorted(prints)[0] if len(prints) == 1 else None


def job_outcome(job: Obj | None, pods: Iterable[Obj], container: str, what: str) -> StepOutcome | None:
    """A one-shot step's verdict from its pod's termination message (StepOutcome.for_storage's JSON).

    Exit 0 without a verdict is not a pass: only the checks' own words count."""
    if job is None:
        return None
    ended = []
    for pod in pods:
        terminated = _terminated(pod, container)
        if terminated is not None:
            ended.append((terminated.get("finishedAt") or "", terminated))
    for _, terminated in sorted(ended, key=lambda item: item[0], reverse=True):
        verdict = pod_verdict(terminated)
        if verdict is not None:
            return verdict
    finished = job_finished(job)
    if finished is None or not ended:
        # No pod seen ended: the cache has not caught up yet, or its pods are gone (a user, pod GC): there is no
        # verdict to read, and no failure either (job_lost: the step runs again).
        return None
    last = _exit_text(sorted(ended, key=lambda item: item[0])[-1][1])
    if finished == "Complete":
        return StepOutcome(
            False, Reason.NO_VERDICT, f"the {what} pod ended without a verdict in its termination message ({last})"
        )
    condition = _condition(job, "Failed") or {}
    return StepOutcome(False, Reason.ERROR, f"the {what} Job failed ({condition.get('reason', '')}): {last}")


def job_lost(job: Obj | None, pods: Iterable[Obj]) -> bool:
    """A finished one-shot Job none of whose pods is left: its verdict went with them, unread."""
    return job is not None and job_finished(job) is not None and not list(pods)
