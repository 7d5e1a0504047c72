"""A server Kueue preempted or evicted after admitting it (docs/kueue.md, "Preemption and eviction"): the run
says Preempted (or Evicted) in Kueue's words until Kueue admits it again, pauses without halting, spends no
retry and no startup budget, and its deleted pods never read as a crash. The Workloads here are shaped as Kueue
v0.17.0 writes them: the scheduler's `workload.Evict` with `SetPreemptedCondition` (pkg/scheduler/preemption),
then the job reconciler's `UnsetQuotaReservationWithCondition` and `SetRequeuedCondition` once the pods are gone
(pkg/controller/jobframework/reconciler.go), then `SetQuotaReservation` on re-admission, which sets Evicted and
Preempted back to False ("Previously: ...")."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from datagen_operator.api.progress import Counts
from datagen_operator.api.status import Condition
from datagen_operator.control.conditions import transition_events
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Step
from datagen_operator.control.observed import (
    KueueEvicted,
    KueueQueued,
    Observed,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from datagen_operator.control.server import server_verdict
from datagen_operator.k8s import metrics
from datagen_operator.k8s.object_facts import kueue_evicted, kueue_queued
from tests.unit.decide_world import PASS, conditions, context, running, spec

NAME = "statefulset-low-server-1a2b3"
PREEMPTION = (
    "Preempted to accommodate a workload (UID: 6f1c, JobUID: UNKNOWN) due to prioritization in the ClusterQueue; "
    "preemptor path: /gpus; preemptee path: /gpus"
)
SHORT = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed"
)
ADMITTED_AT, EVICTED_AT, READMITTED_AT = "2026-12-06T01:00:00Z", "2026-12-06T01:05:00Z", "2026-12-06T01:09:00Z"


def cond(type_: str, status: str, reason: str, message: str, at: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


RESERVED = cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus", ADMITTED_AT)
ADMITTED = cond("Admitted", "True", "Admitted", "The workload is admitted", ADMITTED_AT)
EVICTED = cond("Evicted", "True", "Preempted", PREEMPTION, EVICTED_AT)
PREEMPTED = cond("Preempted", "True", "InClusterQueue", PREEMPTION, EVICTED_AT)


def workload(*conditions: dict[str, str], admitted: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admitted:
        status["admission"] = {"clusterQueue": "gpus", "podSetAssignments": [{"name": "main", "count": 1}]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": NAME, "namespace": "ml", "ownerReferences": [{"kind": "StatefulSet", "uid": "sts-uid"}]},
        "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1}]},
        "status": status,
    }


# The scheduler's eviction: the admission still held while the pods are stopped.
STOPPING = workload(RESERVED, ADMITTED, EVICTED, PREEMPTED)
# The pods are gone: the admission cleared, requeued, in the eviction's words.
REQUEUED = workload(
    cond("QuotaReserved", "False", "Pending", PREEMPTION, EVICTED_AT),
    cond("Admitted", "False", "NoReservation", "The workload has no reservation", EVICTED_AT),
    EVICTED,
    PREEMPTED,
    cond("Requeued", "True", "Preempted", PREEMPTION, EVICTED_AT),
    admitted=False,
)
# The scheduler looked again: the quota is held by the preemptor.
WAITING = workload(
    cond("QuotaReserved", "False", "Pending", SHORT, EVICTED_AT),
    cond("Admitted", "False", "NoReservation", "The workload has no reservation", EVICTED_AT),
    EVICTED,
    PREEMPTED,
    cond("Requeued", "True", "Preempted", PREEMPTION, EVICTED_AT),
    admitted=False,
)
# Admitted again: Kueue sets Evicted and Preempted back to False.
READMITTED = workload(
    cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus", READMITTED_AT),
    cond("Admitted", "True", "Admitted", "The workload is admitted", READMITTED_AT),
    cond("Evicted", "False", "QuotaReserved", f"Previously: {PREEMPTION}", READMITTED_AT),
    cond("Preempted", "False", "QuotaReserved", f"Previously: {PREEMPTION}", READMITTED_AT),
    cond("Requeued", "True", "Preempted", PREEMPTION, EVICTED_AT),
)

GONE = KueueEvicted(NAME, "team-a", "gpus", "Preempted", "InClusterQueue", PREEMPTION)
# What an evicted server's pods look like on their own: deleted (so not listed), then made anew behind the gate.
GATED = ServerInstance(
    "low-server-0", scheduled=False, unschedulable_message="Scheduling is blocked due to non-empty scheduling gates"
)
CRASHED = ServerInstance("low-server-0", running=False, last_exit="exit 137: Error", restarts=0)


def test_a_preempted_workload_is_evicted_in_kueues_words_until_it_is_admitted_again() -> None:
    assert kueue_evicted(STOPPING) == GONE
    assert kueue_queued(STOPPING) is None, "still admitted while its pods are stopped"
    # Requeued: the admission is gone; the LocalQueue's ClusterQueue stands in for it.
    assert kueue_evicted(REQUEUED, cluster_queue="gpus") == GONE
    assert kueue_evicted(REQUEUED) == replace(GONE, cluster_queue=None)
    # The scheduler's words once it looked again: what keeps it out now.
    assert kueue_evicted(WAITING, cluster_queue="gpus") == replace(GONE, waiting=SHORT)
    assert kueue_queued(WAITING) is not None
    assert kueue_evicted(READMITTED) is None
    never = workload(RESERVED, ADMITTED)
    assert kueue_evicted(never) is None


def test_an_eviction_older_than_the_last_admission_is_stale() -> None:
    stale = workload(RESERVED, cond("Admitted", "True", "Admitted", "admitted", READMITTED_AT), EVICTED)
    assert kueue_evicted(stale) is None


def test_an_eviction_for_another_cause_keeps_kueues_reason() -> None:
    timeout = cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ml/x", EVICTED_AT)
    evicted = kueue_evicted(workload(RESERVED, ADMITTED, timeout))
    assert evicted is not None and not evicted.preempted
    assert (evicted.kueue_reason, evicted.preempted_reason) == ("PodsReadyTimeout", None)
    verdict = server_verdict(ServerObservation(1, (GATED,), evicted=(evicted,)), 3600)
    assert (verdict.condition.reason, verdict.fatal) == ("Evicted", False)
    assert verdict.condition.message == (
        "evicted (PodsReadyTimeout) by Kueue in LocalQueue team-a (ClusterQueue gpus): "
        "Exceeded the PodsReady timeout ml/x; waiting for re-admission: requeued"
    )


def test_a_preempted_server_says_preempted_before_its_pods_own_state() -> None:
    message = f"preempted by Kueue in LocalQueue team-a (ClusterQueue gpus): {PREEMPTION}; waiting for re-admission: "
    for pods in ((), (GATED,), (CRASHED,)):
        verdict = server_verdict(ServerObservation(1, pods, evicted=(GONE,)), startup_timeout_s=1)
        assert (verdict.condition.status, verdict.condition.reason, verdict.fatal) == ("False", "Preempted", False)
        assert verdict.condition.message == message + "requeued"
    # Requeued and pending quota: the preemption is still the cause, and the scheduler's words say what is short.
    queued = KueueQueued(NAME, "team-a", "gpus", "Pending", SHORT)
    both = ServerObservation(1, (GATED,), queued=(queued,), evicted=(replace(GONE, waiting=SHORT),))
    assert server_verdict(both, 3600).condition.message == message + SHORT
    # Re-admitted: the pods' own state again (loading, counted from the new container's start).
    loading = ServerInstance("low-server-0", running=True, loading_seconds=5)
    assert server_verdict(ServerObservation(1, (loading,)), 3600).condition.reason == "Loading"


def test_a_preempted_run_mid_generation_pauses_spends_no_retry_and_says_preempted() -> None:
    s = spec()
    observed = replace(running(Counts(records=40)), server=ServerObservation(1, (CRASHED,), evicted=(GONE,)))
    d = decide(s, observed, context(s))
    assert d.step is Step.WAIT_FOR_SERVER and d.server_wanted and d.workers_wanted, "workers wait, not stopped"
    said = conditions(d)
    assert said["ServerReady"] == ("False", "Preempted")
    assert said["Progressing"] == ("False", "Preempted")
    assert said["Succeeded"] == ("Unknown", "Running"), "not a failure"
    progressing = next(u for u in d.updates if u.type == "Progressing")
    assert progressing.message.startswith("workers wait for the server: preempted by Kueue in LocalQueue team-a")
    # Before the workers started: Progressing=False Preempted too, the workers not wanted yet.
    before = Observed(1, preflight=PASS, server=observed.server)
    d = decide(s, before, context(s))
    assert conditions(d)["Progressing"] == ("False", "Preempted") and not d.workers_wanted


def test_the_workers_job_of_a_preempted_run_is_left_running() -> None:
    """The workers pause (a server outage costs no retry: their exit 4 is podFailurePolicy Ignore)."""
    from datagen_operator.api.exit_codes import EXIT_SERVER_UNREACHABLE
    from datagen_operator.control.policy import FREE_EXITS

    assert EXIT_SERVER_UNREACHABLE in FREE_EXITS
    s = spec()
    observed = replace(
        running(Counts(records=40)),
        server=ServerObservation(1, (), evicted=(GONE,)),
        workers=WorkersObservation(2, active=2),
    )
    d = decide(s, observed, context(s))
    assert d.workers_wanted and not d.failed


def test_preempted_is_a_normal_event_and_counts_as_queued_time() -> None:
    def c(type_: str, reason: str) -> Condition:
        return Condition.model_validate(
            {"type": type_, "status": "False", "reason": reason, "message": "m", "lastTransitionTime": EVICTED_AT}
        )

    events = {
        e.reason: e.type for e in transition_events([], [c("ServerReady", "Preempted"), c("Progressing", "Preempted")])
    }
    assert events == {"ServerReadyPreempted": "Normal", "ProgressingPreempted": "Normal"}

    def ready(reason: str) -> dict[str, Any]:
        return {"conditions": [{"type": "ServerReady", "status": "False", "reason": reason}]}

    since = metrics.queued_since(ready("Preempted"), None, 100.0)
    assert since == 100.0
    assert metrics.queued_since(ready("Queued"), since, 150.0) == 100.0
    assert metrics.queued_since(ready("Evicted"), since, 160.0) == 100.0
    assert metrics.queued_since(ready("Loading"), since, 200.0) is None


def test_the_operator_reads_queued_and_evicted_from_one_list_of_the_workloads() -> None:
    import asyncio
    from types import SimpleNamespace

    from datagen_operator.k8s.context import RunCache
    from datagen_operator.k8s.observer import KueueWorkloads, Observer
    from tests.unit.control.test_kueue_queued import FakeKueue

    kube = FakeKueue([WAITING], {"team-a": "gpus"})
    observer = Observer(ctx=SimpleNamespace(kube=kube), cache=RunCache(ctx=None, namespace="ml", name="low"))  # type: ignore[arg-type]
    gated = {"metadata": {"name": "low-server-0"}, "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}
    listed = KueueWorkloads(kube, "ml")  # type: ignore[arg-type]
    queued, evicted = asyncio.run(observer._kueue("team-a", {"metadata": {"uid": "sts-uid"}}, [gated], listed))
    assert evicted == (replace(GONE, waiting=SHORT),)
    assert [q.message for q in queued] == [SHORT]
    assert kube.lists == 1
    # While its pods are stopped it is evicted, not queued, and its gated successor is not "waiting for Kueue".
    kube.workloads = [STOPPING]
    listed = KueueWorkloads(kube, "ml")  # type: ignore[arg-type]  (the next pass lists anew)
    queued, evicted = asyncio.run(observer._kueue("team-a", {"metadata": {"uid": "sts-uid"}}, [gated], listed))
    assert (queued, evicted) == ((), (GONE,))


def test_a_leaderworkerset_group_evicted_beside_a_ready_one_serves_on_degraded() -> None:
    second = replace(GONE, workload="leaderworkerset-low-server-1-x")
    both = server_verdict(ServerObservation(2, (GATED,), evicted=(GONE, second)), 3600)
    assert both.condition.reason == "Preempted"
    assert both.condition.message.startswith("2 of 2 server groups preempted by Kueue in LocalQueue team-a")
    ready = ServerInstance("low-server-0", running=True, ready=True, endpoint="http://low-server-0:30000")
    one = server_verdict(ServerObservation(2, (ready, GATED), evicted=(second,)), 3600)
    assert (one.condition.status, one.condition.reason) == ("True", "Degraded")
