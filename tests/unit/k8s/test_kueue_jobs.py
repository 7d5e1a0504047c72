"""The run's CPU Jobs where Kueue manages Jobs (docs/kueue.md, "The run's CPU Jobs"), without a cluster: a Job
Kueue holds reads Progressing=False Queued (where, and Kueue's words; spec.queue named when the Job has no
LocalQueue at all); a managed workers' Job is paused and resumed through its Workload's spec.active, never its
spec.suspend; a Job held outside spec.queue's LocalQueue is made anew in it. tests/operator/test_kueue_jobs.py
runs the same rules against the real Kueue."""

from __future__ import annotations

from datagen_operator.api import parse_spec
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import JobWorkload, KueueQueued, Observed
from datagen_operator.k8s.children import (
    Action,
    ActivateWorkload,
    Child,
    Children,
    Delete,
    JobState,
    SuspendWorkers,
    WantedServer,
    plan,
)
from datagen_operator.k8s.kueue_jobs import NO_QUEUE_FIX, with_jobs_queued
from tests.manifests import unit_spec
from tests.unit.decide_world import conditions, context, spec

SHORT = "couldn't assign flavors to pod set main: insufficient quota for cpu in flavor cpu, request > maximum capacity"
HELD = KueueQueued("job-kimi-preflight-1a2b3", "team-a", "cpus", "Pending", SHORT)
# A Job in a namespace where Kueue manages every Job, with no LocalQueue: Kueue's Workload names none.
NO_QUEUE = KueueQueued("job-kimi-preflight-1a2b3", "", None, "Inadmissible", "LocalQueue  doesn't exist")
URLS = ["http://kimi-server-0.ml:30000", "http://kimi-server-1.ml:30000"]
PLAIN = parse_spec(unit_spec())
QUEUED_SPEC = parse_spec(unit_spec(**{"queue.name": "team-a"}))


def test_a_preflight_kueue_holds_reads_queued_naming_both_queues_in_kueues_words() -> None:
    s = spec()
    observed = Observed(1, job_workloads={Child.PREFLIGHT: JobWorkload(HELD.workload, queued=HELD)})
    d = with_jobs_queued(decide(s, observed, context(s)), observed)
    assert d.step is Step.PREFLIGHT
    said = {u.type: u for u in d.updates}
    assert (said["Progressing"].status, said["Progressing"].reason) == ("False", "Queued")
    assert said["Progressing"].message == (
        f"the preflight Job is queued by Kueue in LocalQueue team-a (ClusterQueue cpus): {SHORT}"
    )
    assert [u.type for u in d.updates].count("Progressing") == 1
    assert conditions(d)["Succeeded"] == ("Unknown", "Running")  # waiting, not failing
    # Without Kueue's word the decision is what it was.
    assert with_jobs_queued(decide(s, Observed(1), context(s)), Observed(1)) == decide(s, Observed(1), context(s))


def test_a_job_that_names_no_local_queue_says_spec_queue_is_the_fix() -> None:
    s = spec()
    observed = Observed(1, job_workloads={Child.PREFLIGHT: JobWorkload(NO_QUEUE.workload, queued=NO_QUEUE)})
    said = {u.type: u for u in with_jobs_queued(decide(s, observed, context(s)), observed).updates}
    assert said["Progressing"].reason == "Queued"
    assert said["Progressing"].message == f"the preflight Job waits: {NO_QUEUE_FIX}"
    assert "set spec.queue" in said["Progressing"].message


def test_only_the_job_the_step_waits_on_and_only_while_held_reads_queued() -> None:
    held = JobWorkload(HELD.workload, queued=HELD)
    base = Decision(step=Step.RUN_CANARY)
    # The canary's step, the preflight's Workload: nothing to say.
    assert with_jobs_queued(base, Observed(1, job_workloads={Child.PREFLIGHT: held})) == base
    # Admitted (no longer queued), or paused by the operator (spec.active false): not Kueue holding it.
    assert with_jobs_queued(base, Observed(1, job_workloads={Child.CANARY: JobWorkload("w")})) == base
    paused = JobWorkload(HELD.workload, active=False, queued=HELD)
    assert with_jobs_queued(Decision(step=Step.RUN_WORKERS), Observed(1, job_workloads={Child.WORKERS: paused})) == (
        Decision(step=Step.RUN_WORKERS)
    )
    for step, child in [
        (Step.RUN_CANARY, Child.CANARY),
        (Step.RUN_WORKERS, Child.WORKERS),
        (Step.FINAL_VERIFY, Child.VERIFY),
        (Step.EXPORT, Child.EXPORT),
    ]:
        d = with_jobs_queued(Decision(step=step), Observed(1, job_workloads={child: held}))
        assert [(u.type, u.status, u.reason) for u in d.updates] == [("Progressing", "False", "Queued")], step


def planned(children: Children, observed: Observed, *, workers: bool, spec_: DataGenRunSpec = PLAIN) -> list[Action]:
    actions = plan(
        spec_,
        Decision(step=Step.RUN_WORKERS if workers else Step.SUSPENDED, server_wanted=workers, workers_wanted=workers),
        observed,
        children,
        1,
        urls=URLS,
        server=WantedServer(restart_hash="r", admission_hash="a"),
    )
    jobs = {Child.PREFLIGHT, Child.CANARY, Child.WORKERS, Child.VERIFY, Child.EXPORT, Child.RELEASE}
    return [a for a in actions if isinstance(a, SuspendWorkers | ActivateWorkload) or getattr(a, "child", None) in jobs]


def test_a_managed_workers_job_is_paused_and_resumed_through_its_workload_never_its_suspend() -> None:
    urls = ",".join(URLS)
    running = Children(jobs={Child.WORKERS: JobState(server_urls=urls, queue_name="default")})
    admitted = Observed(1, job_workloads={Child.WORKERS: JobWorkload("job-kimi-workers-1")})
    assert planned(running, admitted, workers=False) == [ActivateWorkload(Child.WORKERS, "job-kimi-workers-1", False)]
    assert planned(running, admitted, workers=True) == []
    # Paused: Kueue suspended the Job (its Workload deactivated); resumed by spec.active, not by spec.suspend.
    paused = Children(jobs={Child.WORKERS: JobState(server_urls=urls, suspended=True, queue_name="default")})
    deactivated = Observed(
        1, job_workloads={Child.WORKERS: JobWorkload("job-kimi-workers-1", active=False, queued=HELD)}
    )
    assert planned(paused, deactivated, workers=True) == [ActivateWorkload(Child.WORKERS, "job-kimi-workers-1", True)]
    assert planned(paused, deactivated, workers=False) == []
    # Held by Kueue (suspended, queued, active) while wanted: Kueue's to start, nothing to patch.
    held = Observed(1, job_workloads={Child.WORKERS: JobWorkload("job-kimi-workers-1", queued=HELD)})
    assert planned(paused, held, workers=True) == []
    # Kueue's queue label but its Workload not read yet: left to Kueue, no suspend patch.
    assert planned(paused, Observed(1), workers=True) == []


def test_an_unmanaged_workers_job_keeps_its_suspend() -> None:
    urls = ",".join(URLS)
    running = Children(jobs={Child.WORKERS: JobState(server_urls=urls)})
    assert planned(running, Observed(1), workers=False) == [SuspendWorkers(True)]
    paused = Children(jobs={Child.WORKERS: JobState(server_urls=urls, suspended=True)})
    assert planned(paused, Observed(1), workers=True) == [SuspendWorkers(False)]


def test_a_job_held_outside_spec_queues_local_queue_is_made_anew_in_it() -> None:
    observed = Observed(1, job_workloads={Child.PREFLIGHT: JobWorkload(NO_QUEUE.workload, queued=NO_QUEUE)})
    unlabelled = Children(jobs={Child.PREFLIGHT: JobState(data_generation="1", suspended=True)})
    (deleted,) = planned(unlabelled, observed, workers=False, spec_=QUEUED_SPEC)
    assert isinstance(deleted, Delete) and deleted.child is Child.PREFLIGHT
    assert "LocalQueue team-a" in deleted.why
    # Already in spec.queue's LocalQueue, admitted, or without spec.queue: kept.
    labelled = Children(jobs={Child.PREFLIGHT: JobState(data_generation="1", suspended=True, queue_name="team-a")})
    assert planned(labelled, observed, workers=False, spec_=QUEUED_SPEC) == []
    admitted = Observed(1, job_workloads={Child.PREFLIGHT: JobWorkload(NO_QUEUE.workload)})
    assert planned(unlabelled, admitted, workers=False, spec_=QUEUED_SPEC) == []
    assert planned(unlabelled, observed, workers=False, spec_=PLAIN) == []
