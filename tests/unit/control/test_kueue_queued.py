"""A server Kueue has not admitted (docs/kueue.md): the run says Queued, where and what is short, in Kueue's
words; it waits (no halt, no startup budget spent) and moves on once admitted. The Workload objects here
have the shape the real Kueue v0.17.0 writes (tests/cluster/test_kueue.py reads them from it)."""

from __future__ import annotations

from typing import Any

from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from datagen_operator.control.observed import KueueQueued, Observed, ServerInstance, ServerObservation
from datagen_operator.control.server import server_verdict
from datagen_operator.k8s.object_facts import kueue_gated, kueue_local_queue, kueue_queued
from tests.unit.decide_world import conditions, context, spec

SHORT = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed"
)
# A gated pod as the scheduler reports it: Kueue's gate keeps it off every node.
GATED = ServerInstance(
    "kimi-server-0", scheduled=False, unschedulable_message="Scheduling is blocked due to non-empty scheduling gates"
)
QUEUED = KueueQueued("statefulset-kimi-server-1a2b3", "team-a", "gpus", "Pending", SHORT)


def workload(conditions: list[dict[str, str]], admission: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions}
    if admission is not None:
        status["admission"] = admission
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "statefulset-kimi-server-1a2b3",
            "namespace": "ml",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "kimi-server", "uid": "sts-uid"}
            ],
        },
        "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1}]},
        "status": status,
    }


def test_a_pending_workload_is_queued_in_kueues_words_naming_both_queues() -> None:
    pending = workload([{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": SHORT}])
    assert kueue_queued(pending, cluster_queue="gpus") == QUEUED
    # Without the LocalQueue read, the ClusterQueue is not known: never guessed.
    assert kueue_queued(pending) == KueueQueued(QUEUED.workload, "team-a", None, "Pending", SHORT)


def test_an_inadmissible_workload_keeps_kueues_reason() -> None:
    missing = workload(
        [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Inadmissible",
                "message": "LocalQueue team-a doesn't exist",
            }
        ]
    )
    queued = kueue_queued(missing)
    assert queued is not None and (queued.kueue_reason, queued.message) == (
        "Inadmissible",
        "LocalQueue team-a doesn't exist",
    )
    verdict = server_verdict(ServerObservation(1, (GATED,), queued=(queued,)), 3600)
    assert (
        verdict.condition.message
        == "queued by Kueue in LocalQueue team-a: Inadmissible: LocalQueue team-a doesn't exist"
    )


def test_an_admitted_workload_is_not_queued_and_quota_alone_waits_on_the_admission_checks() -> None:
    admitted = workload(
        [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
        ],
        admission={"clusterQueue": "gpus"},
    )
    assert kueue_queued(admitted) is None
    checking = workload(
        [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved"},
            {"type": "Admitted", "status": "False", "reason": "NoChecks", "message": "waiting for provisioning"},
        ],
        admission={"clusterQueue": "gpus"},
    )
    assert kueue_queued(checking) == KueueQueued(
        QUEUED.workload, "team-a", "gpus", "NoChecks", "waiting for provisioning"
    )


def test_a_queued_server_says_so_rather_than_unschedulable_and_the_run_waits() -> None:
    s = spec()
    d = decide(s, Observed(1, server=ServerObservation(1, (GATED,), queued=(QUEUED,))), context(s))
    assert d.step is Step.WAIT_FOR_SERVER and d.server_wanted
    said = {u.type: u for u in d.updates}
    message = f"queued by Kueue in LocalQueue team-a (ClusterQueue gpus): {SHORT}"
    assert (said["ServerReady"].status, said["ServerReady"].reason, said["ServerReady"].message) == (
        "False",
        "Queued",
        message,
    )
    assert (said["Progressing"].status, said["Progressing"].reason, said["Progressing"].message) == (
        "False",
        "Queued",
        message,
    )
    assert conditions(d)["Succeeded"] == ("Unknown", "Running")  # waiting, not failing
    assert d.phase == "Queued"  # what `kubectl get dgr` shows
    # The same pod without Kueue's word is what it was before: Unschedulable in the scheduler's words.
    d = decide(s, Observed(1, server=ServerObservation(1, (GATED,))), context(s))
    assert conditions(d)["ServerReady"] == ("False", "Unschedulable")
    assert d.phase == "Starting"
    assert conditions(d)["Progressing"] == ("False", "Waiting")


def test_a_queued_server_spends_no_startup_budget_however_long_it_waits() -> None:
    # Loading is counted from the container's start; a gated pod has none, so no wait in a queue ever ends the run.
    verdict = server_verdict(ServerObservation(1, (GATED,), queued=(QUEUED,)), startup_timeout_s=1)
    assert not verdict.fatal and verdict.condition.reason == "Queued"


def test_admission_moves_it_on_at_once_to_loading() -> None:
    loading = ServerInstance("kimi-server-0", running=True, loading_seconds=5)
    verdict = server_verdict(ServerObservation(1, (loading,)), 3600)
    assert verdict.condition.reason == "Loading"
    s = spec()
    assert decide(s, Observed(1, server=ServerObservation(1, (loading,))), context(s)).phase == "Starting"


def test_groups_of_a_leaderworkerset_count_the_queued_ones_and_a_ready_group_serves() -> None:
    second = KueueQueued("leaderworkerset-kimi-server-1-x", "team-a", "gpus", "Pending", SHORT)
    both = server_verdict(ServerObservation(2, (GATED,), queued=(QUEUED, second)), 3600)
    assert both.condition.message.startswith("2 of 2 server groups queued by Kueue in LocalQueue team-a")
    ready = ServerInstance("kimi-server-0", running=True, ready=True, endpoint="http://kimi-server-0:30000")
    one = server_verdict(ServerObservation(2, (ready, GATED), queued=(second,)), 3600)
    assert (one.condition.status, one.condition.reason) == ("True", "Degraded")


def test_only_kueues_admission_gate_marks_a_pod_held_by_kueue() -> None:
    def pod(*gates: str) -> dict[str, Any]:
        return {"metadata": {"name": "kimi-server-0"}, "spec": {"schedulingGates": [{"name": g} for g in gates]}}

    assert kueue_gated(pod("example.com/other", "kueue.x-k8s.io/admission"))
    assert not kueue_gated(pod("example.com/other"))
    assert not kueue_gated(pod())
    assert not kueue_gated({"metadata": {"name": "p"}})


def test_a_pod_whose_gate_was_just_lifted_is_pending_not_unschedulable() -> None:
    """Kueue lifts the gate on admission; until the scheduler looks, PodScheduled still says SchedulingGated."""
    from datetime import UTC, datetime

    from datagen_operator.k8s.object_facts import server_instance

    condition = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": "blocked"}
    pod: dict[str, Any] = {"metadata": {"name": "kimi-server-0"}, "spec": {}, "status": {"conditions": [condition]}}
    assert server_instance(pod, datetime.now(UTC), None, None, True).scheduled
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    held = server_instance(pod, datetime.now(UTC), None, None, True)
    assert not held.scheduled and held.unschedulable_message == "blocked"


class FakeKueue:
    """The two Kueue reads of Observer._kueue: `workloads` or a status to refuse with; LocalQueue -> ClusterQueue."""

    def __init__(self, workloads: list[dict[str, Any]] | int, cluster_queues: dict[str, str] | None = None) -> None:
        self.workloads, self.cluster_queues, self.lists = workloads, cluster_queues or {}, 0

    async def kueue_workloads(self, namespace: str) -> list[dict[str, Any]]:
        from kubernetes_asyncio.client.exceptions import ApiException

        self.lists += 1
        if isinstance(self.workloads, int):
            raise ApiException(status=self.workloads, reason="refused")
        return self.workloads

    async def kueue_cluster_queue(self, namespace: str, local_queue: str) -> str | None:
        return self.cluster_queues.get(local_queue)


def queued_of(kube: FakeKueue, pods: list[dict[str, Any]] | None = None) -> tuple[KueueQueued, ...]:
    import asyncio
    from types import SimpleNamespace

    from datagen_operator.k8s.context import RunCache
    from datagen_operator.k8s.observer import KueueWorkloads, Observer

    observer = Observer(ctx=SimpleNamespace(kube=kube), cache=RunCache(ctx=None, namespace="ml", name="kimi"))  # type: ignore[arg-type]
    listed = KueueWorkloads(kube, "ml")  # type: ignore[arg-type]
    return asyncio.run(observer._kueue("team-a", {"metadata": {"uid": "sts-uid"}}, pods or [], listed))[0]


def test_the_namespaces_workloads_are_listed_once_a_pass_and_the_server_keeps_its_own() -> None:
    import asyncio

    from datagen_operator.k8s.observer import KueueWorkloads

    pending = workload([{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": SHORT}])
    other = {**pending, "metadata": {**pending["metadata"], "name": "other", "ownerReferences": [{"uid": "x"}]}}
    kube = FakeKueue([pending, other], {"team-a": "gpus"})
    (queued,) = queued_of(kube)  # another run's Workload in the namespace is not this server's
    assert queued.workload == pending["metadata"]["name"]
    listed = KueueWorkloads(kube, "ml")  # type: ignore[arg-type]
    kube.lists = 0
    assert asyncio.run(listed.get()) == asyncio.run(listed.get()) == [pending, other]
    assert kube.lists == 1  # the server's reading and the Jobs' share one list call
    refused = KueueWorkloads(FakeKueue(404), "ml")  # type: ignore[arg-type]
    assert asyncio.run(refused.get()) is None and asyncio.run(refused.get()) is None
    assert refused.unreadable == 404 and refused.kube.lists == 1  # type: ignore[attr-defined]


def test_a_pending_workload_read_by_the_operator_names_the_local_queues_cluster_queue() -> None:
    pending = workload([{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": SHORT}])
    (queued,) = queued_of(FakeKueue([pending], {"team-a": "gpus"}))
    assert (queued.local_queue, queued.cluster_queue, queued.message) == ("team-a", "gpus", SHORT)


def test_where_kueue_is_missing_or_unreadable_a_queued_run_goes_on_and_says_so(
    caplog: Any,
) -> None:
    for status in (404, 403):
        caplog.clear()
        kube = FakeKueue(status)
        assert queued_of(kube) == ()
        assert kube.lists == 1
        (record,) = [r for r in caplog.records if "LocalQueue team-a (spec.queue" in r.getMessage()]
        assert ("Kueue is not installed" if status == 404 else "may not list") in record.getMessage()


def test_a_pod_behind_kueues_gate_before_its_workload_is_read_is_queued() -> None:
    gated = {"metadata": {"name": "kimi-server-0"}, "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    (queued,) = queued_of(FakeKueue([]), [gated])
    assert queued.local_queue == "team-a" and "waiting for Kueue" in queued.message
    assert queued_of(FakeKueue([]), [{"metadata": {"name": "kimi-server-0"}, "spec": {}}]) == ()


def test_a_server_is_read_in_the_queue_its_label_names_from_spec_queue_or_kueues_default_local_queue() -> None:
    from datagen_operator.api import parse_spec
    from datagen_operator.k8s import object_meta, server_manifests
    from tests.manifests import unit_spec

    # spec.queue's label, or the one Kueue's webhook put on from the namespace's LocalQueue `default` (no
    # spec.queue): either way Kueue holds the server, so the operator reads its Workloads and says Queued.
    run = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")
    queued = server_manifests.server_workload(run, parse_spec(unit_spec(**{"queue.name": "team-a"})), 1)
    assert kueue_local_queue(queued) == "team-a"
    defaulted = server_manifests.server_workload(run, parse_spec(unit_spec()), 1)
    assert kueue_local_queue(defaulted) is None  # not Kueue's unless it says so
    defaulted["metadata"]["labels"][object_meta.KUEUE_QUEUE_LABEL] = "default"
    assert kueue_local_queue(defaulted) == "default"


def test_a_queue_the_operator_cannot_read_is_said_beside_the_servers_state() -> None:
    # spec.queue where Kueue is not installed: the label queues nothing and the server takes its GPUs straight
    # from the scheduler; the run says so in ServerReady, whatever the server's state, rather than in a log alone.
    from datagen_operator.k8s.observer import KUEUE_UNREAD

    ready = ServerInstance("kimi-server-0", running=True, ready=True, endpoint="http://x")
    for status, words in ((404, "spec.queue has no effect: Kueue is not installed"), (403, "its RBAC")):
        said = server_verdict(ServerObservation(1, (ready,), kueue_unread=KUEUE_UNREAD[status]), 3600).condition
        assert (said.status, said.reason) == ("True", "Ready")
        assert said.message.startswith("1/1 replica ready") and words in said.message, said.message
    said = server_verdict(ServerObservation(1, (GATED,), kueue_unread=KUEUE_UNREAD[403]), 3600).condition
    assert said.reason == "Unschedulable" and "whether Kueue holds the server is not known" in said.message
    assert "Kueue" not in server_verdict(ServerObservation(1, (ready,)), 3600).condition.message
