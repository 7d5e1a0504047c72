"""A server over several nodes seen as one replica per LeaderWorkerSet group (k8s/groups.py), and the
ServerReady verdict it leads to (control/server.py, unchanged for groups)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api import parse_spec
from datagen_operator.control.observed import ServerObservation
from datagen_operator.control.server import server_verdict
from datagen_operator.k8s import object_meta, server_manifests
from datagen_operator.k8s.context import RunCache
from datagen_operator.k8s.executor import LWS_MISSING, Executor
from datagen_operator.k8s.groups import group_observation
from tests.manifests import unit_spec
from tests.unit.k8s.test_reconcile import restart_hash

NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
LEADER_STS = {"metadata": {"name": "kimi-server"}, "status": {"updateRevision": "r1"}}
STARTED = (NOW - timedelta(seconds=120)).isoformat().replace("+00:00", "Z")
UNPLACEABLE = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def pod(name: str, *, leader: bool, ready: bool = False, running: bool = True, **status: Any) -> dict[str, Any]:
    labels = {"controller-revision-hash": "r1"} if leader else {}
    body: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}], **status}
    if running:
        body["containerStatuses"] = [
            {"name": "server", "restartCount": 0, "state": {"running": {"startedAt": STARTED}}}
        ]
    return {"metadata": {"name": name, "labels": labels}, "status": body}


def unplaced(name: str) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNPLACEABLE}
    return {"metadata": {"name": name, "labels": {}}, "status": {"phase": "Pending", "conditions": [condition]}}


def observe(
    pods: list[dict[str, Any]], *, size: int = 2, replicas: int = 1, health: dict[str, bool] | None = None
) -> ServerObservation:
    urls = [f"http://kimi-server-{i}.ml.svc:30000" for i in range(replicas)]
    return group_observation(pods, LEADER_STS, replicas, size, urls, health or {}, NOW)


def test_a_group_serves_through_its_leader_once_every_rank_runs() -> None:
    observed = observe(
        [pod("kimi-server-0", leader=True, ready=True), pod("kimi-server-0-1", leader=False)],
        health={"kimi-server-0": True},
    )
    (group,) = observed.instances
    assert group.name == "kimi-server-0" and group.ready
    assert observed.ready_endpoints == ("http://kimi-server-0.ml.svc:30000",)
    assert server_verdict(observed, 2700).condition.reason == "Ready"


def test_a_group_without_its_worker_is_not_ready_even_if_the_leader_says_so() -> None:
    (group,) = observe([pod("kimi-server-0", leader=True, ready=True)], health={"kimi-server-0": True}).instances
    assert not group.ready and not group.running


def test_an_unplaceable_worker_names_the_scheduler_and_the_half_placed_group() -> None:
    observed = observe(
        [pod("kimi-server-0", leader=True), pod("kimi-server-0-1", leader=False), unplaced("kimi-server-0-2")], size=3
    )
    verdict = server_verdict(observed, 2700).condition
    assert (verdict.status, verdict.reason) == ("False", "Unschedulable")
    assert verdict.message == (
        f"kimi-server-0: {UNPLACEABLE} (kimi-server-0-2 of a group of 3; 2 of its pods placed and holding their "
        "GPUs meanwhile)"
    )


def test_a_crashing_worker_is_the_groups_crash() -> None:
    crashed = pod(
        "kimi-server-0-1",
        leader=False,
        running=False,
        containerStatuses=[
            {
                "name": "server",
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "NCCL error: unhandled system error"}},
            }
        ],
    )
    observed = observe([pod("kimi-server-0", leader=True), crashed])
    (group,) = observed.instances
    assert (group.waiting_reason, group.restarts) == ("CrashLoopBackOff", 1)
    assert server_verdict(observed, 2700).condition.reason == "CrashLoop"
    assert "NCCL error" in server_verdict(observed, 2700).condition.message


def test_groups_by_replica_and_only_the_current_revision_serves() -> None:
    pods = [
        pod("kimi-server-0", leader=True, ready=True),
        pod("kimi-server-0-1", leader=False),
        pod("kimi-server-1", leader=True, ready=True),
        pod("kimi-server-1-1", leader=False),
        pod("kimi-server-2", leader=True, ready=True),  # left by a scale-down
    ]
    health = {"kimi-server-0": True, "kimi-server-1": True}
    observed = observe(pods, replicas=2, health=health)
    assert [g.name for g in observed.instances] == ["kimi-server-0", "kimi-server-1"]
    assert len(observed.ready_endpoints) == 2
    stale = {**LEADER_STS, "status": {"updateRevision": "r2"}}
    urls = ["a", "b"]
    assert not group_observation(pods, stale, 2, 2, urls, health, NOW).ready_endpoints


def test_a_loading_group_counts_its_leaders_load_time() -> None:
    observed = observe([pod("kimi-server-0", leader=True), pod("kimi-server-0-1", leader=False)])
    verdict = server_verdict(observed, 2700).condition
    assert (verdict.reason, verdict.message) == (
        "Loading",
        "loading the model: 2m of server.startupTimeout 45m, counted from kimi-server-0's start",
    )


def test_a_cluster_without_leaderworkerset_says_so_in_server_ready() -> None:
    """Creating the group where the CRD is missing answers 404: kept as the refusal that ServerReady shows."""

    async def create() -> None:
        raise ApiException(status=404, reason="Not Found")

    executor = Executor(kube=None, cache=RunCache(ctx=None, namespace="ml", name="kimi"))  # type: ignore[arg-type]
    assert asyncio.run(executor.write("LeaderWorkerSet", "kimi-server", create)) is False
    assert executor.refused_writes == {"LeaderWorkerSet/kimi-server": LWS_MISSING}
    observed = group_observation([], None, 1, 2, ["u"], {}, NOW, executor.refused_writes["LeaderWorkerSet/kimi-server"])
    verdict = server_verdict(observed, 2700).condition
    assert (verdict.status, verdict.reason) == ("False", "Refused")
    assert verdict.message.startswith("LeaderWorkerSet is not installed in this cluster")
    assert "install LWS (docs/install.md) or set server.nodes to 1" in verdict.message

    async def other() -> None:
        raise ApiException(status=404, reason="Not Found")

    # A 404 of any other kind is no refusal: the pass fails and the next one retries.
    with pytest.raises(ApiException):
        asyncio.run(executor.write("StatefulSet", "kimi-server", other))


def test_a_group_restarts_for_its_templates_not_for_live_placement() -> None:
    run = object_meta.RunRef("kimi", "ml", "u")
    spec = parse_spec(unit_spec(**{"server.nodes": 2, "server.tensorParallel": 16}))
    base = restart_hash(server_manifests.server_workload(run, spec, 1))
    moved = parse_spec(
        unit_spec(**{"server.nodes": 2, "server.tensorParallel": 16, "server.nodeSelector": {"pool": "b"}})
    )
    assert restart_hash(server_manifests.server_workload(run, moved, 1)) == base
    longer = parse_spec(unit_spec(**{"server.nodes": 2, "server.tensorParallel": 16, "server.shmSize": "128Gi"}))
    assert restart_hash(server_manifests.server_workload(run, longer, 1)) != base
