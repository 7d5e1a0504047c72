"""LeaderWorkerSet groups -> control.observed: one ServerInstance per group (a server over several nodes).

Pure. LWS names a group's leader <set>-<i> (made by the leader StatefulSet <set>, so its pods carry that
StatefulSet's revision label) and its workers <set>-<i>-<rank>. A group serves when its leader does: the
leader's /health_generate runs a generation through every rank. Until then, the group is as far along as
its least advanced pod: one pod the scheduler cannot place keeps the whole server down, and its words
say why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from datagen_operator.control.observed import ServerInstance, ServerObservation
from datagen_operator.k8s.object_facts import Obj, replica_index, server_instance


def worker_rank(pod_name: str, leader: str) -> int | None:
    match = re.fullmatch(re.escape(leader) + r"-(\d+)", pod_name)
    return int(match[1]) if match else None


def group_instance(leader: ServerInstance, workers: Sequence[ServerInstance], size: int) -> ServerInstance:
    """The group as one replica: ready when its leader is and every worker runs; otherwise the first
    problem of any of its pods, named."""
    missing = size - 1 - len(workers)
    pods = [leader, *workers]
    unplaced = [p for p in pods if not p.scheduled and p.unschedulable_message]
    unschedulable = None
    if unplaced:
        placed = len([p for p in pods if p.scheduled])
        unschedulable = (
            f"{unplaced[0].unschedulable_message} ({unplaced[0].name} of a group of {size}; "
            f"{placed} of its pods placed and holding their GPUs meanwhile)"
        )
    troubled = next((p for p in pods if p.waiting_reason or (p.last_exit and not p.running)), None)
    workers_running = missing == 0 and all(w.running for w in workers)
    return replace(
        leader,
        scheduled=not unplaced,
        unschedulable_message=unschedulable,
        running=leader.running and workers_running,
        ready=leader.ready and workers_running,
        restarts=max(p.restarts for p in pods),
        waiting_reason=troubled.waiting_reason if troubled else None,
        last_exit=troubled.last_exit if troubled else leader.last_exit,
    )


def group_observation(
    pods: Iterable[Obj],
    leader_statefulset: Obj | None,
    replicas: int,
    size: int,
    urls: Sequence[str],
    health: Mapping[str, bool],
    now: datetime,
    refused: str | None = None,
) -> ServerObservation:
    """The groups of the current revision, by replica index; `health` holds the operator's own
    /health_generate answers by leader pod name."""
    if leader_statefulset is None:
        return ServerObservation(replicas_wanted=replicas, refused=refused)
    name = leader_statefulset["metadata"]["name"]
    revision = (leader_statefulset.get("status") or {}).get("updateRevision")
    live = sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])
    instances = []
    for pod in live:
        index = replica_index(pod["metadata"]["name"], name)
        if index is None or index >= replicas:
            continue
        leader_name = pod["metadata"]["name"]
        current = revision is None or pod["metadata"].get("labels", {}).get("controller-revision-hash") == revision
        endpoint = urls[index] if index < len(urls) else None
        leader = server_instance(pod, now, endpoint, health.get(leader_name), current)
        workers = [
            server_instance(w, now, None, None, True)
            for w in live
            if (rank := worker_rank(w["metadata"]["name"], leader_name)) is not None and 0 < rank < size
        ]
        instances.append(group_instance(leader, workers, size))
    return ServerObservation(replicas_wanted=replicas, instances=tuple(instances), refused=refused)
