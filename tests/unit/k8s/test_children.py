"""The operator's child rules (k8s/children.py), one test per rule, without a cluster: which children a
pass applies, creates, scales, suspends or deletes, given the decision and what exists. The operator tests
(tests/operator/) run the same rules against a real API server; these name each rule and its edge."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from datagen_operator.api import parse_spec
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import DataGenRunStatus
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import HaltedBefore, Observed, ServerInstance, ServerObservation
from datagen_operator.k8s import object_meta, run_manifests, server_hashes, server_manifests
from datagen_operator.k8s.children import (
    Action,
    Apply,
    Child,
    Children,
    Create,
    Delete,
    JobState,
    Serve,
    SuspendWorkers,
    WantedServer,
    made_for,
    plan,
    spec_applied,
    spec_in_force,
)
from datagen_operator.k8s.inventory import inventory
from tests.manifests import unit_spec

SPEC = parse_spec(unit_spec())  # two replicas, one node each
URLS = ["http://kimi-server-0.ml:30000", "http://kimi-server-1.ml:30000"]
HASH = "restart-1"
ADMITTED = "admission-1"
PASSED = StepOutcome(True, "Passed", "ok")
CURRENT = JobState(data_generation="1")
OLDER = JobState(data_generation="0")


def decision(step: Step, *, server: bool = False, workers: bool = False) -> Decision:
    return Decision(step=step, server_wanted=server, workers_wanted=workers)


def planned(
    step: Step = Step.PREFLIGHT,
    children: Children | None = None,
    *,
    spec: DataGenRunSpec = SPEC,
    server: bool = False,
    workers: bool = False,
    observed: Observed | None = None,
) -> list[Action]:
    return plan(
        spec,
        decision(step, server=server, workers=workers),
        observed or Observed(generation=1),
        children or Children(),
        1,
        urls=URLS,
        server=WantedServer(restart_hash=HASH, admission_hash=ADMITTED),
    )


def steps(actions: list[Action]) -> list[Action]:
    """The actions about Jobs (the server's and the shared children's set aside)."""
    jobs = {Child.PREFLIGHT, Child.CANARY, Child.WORKERS, Child.VERIFY, Child.EXPORT, Child.RELEASE}
    return [a for a in actions if isinstance(a, SuspendWorkers) or getattr(a, "child", None) in jobs]


def serving(actions: list[Action]) -> list[Serve]:
    return [a for a in actions if isinstance(a, Serve)]


# --- every pass ------------------------------------------------------------------------------------


def test_every_pass_applies_the_workers_rbac_one_progress_configmap_per_shard_and_the_services() -> None:
    spec = parse_spec(unit_spec(**{"clients.shards": 3}))
    actions = planned(spec=spec)
    applied = [a for a in actions if isinstance(a, Apply)]
    assert applied == [
        Apply(Child.WORKER_ACCOUNT),
        Apply(Child.WORKER_ROLE),
        Apply(Child.WORKER_ROLE_BINDING),
        *(Apply(Child.SHARD_PROGRESS, i) for i in range(3)),
        Apply(Child.HEADLESS_SERVICE),
        Apply(Child.REPLICA_SERVICE, 0),
        Apply(Child.REPLICA_SERVICE, 1),
    ]


# --- the server ------------------------------------------------------------------------------------


def test_no_server_workload_is_written_before_one_is_wanted() -> None:
    assert serving(planned(Step.PREFLIGHT)) == []


def test_a_wanted_server_is_served_at_the_specs_replicas() -> None:
    assert serving(planned(Step.WAIT_FOR_SERVER, server=True)) == [Serve(2, keep_template=False)]


def test_a_server_no_longer_wanted_is_scaled_to_zero_not_deleted() -> None:
    actions = planned(Step.DONE, Children(statefulset=True, server_replicas=2))
    assert serving(actions) == [Serve(0, keep_template=False)]
    assert not [a for a in actions if isinstance(a, Delete)]


def test_a_server_on_its_node_keeps_its_template_when_only_live_fields_moved() -> None:
    loaded = Children(statefulset=True, server_replicas=2, server_holds_a_node=True, server_restart_hash=HASH)
    assert serving(planned(Step.RUN_WORKERS, loaded, server=True)) == [Serve(2, keep_template=True)]


def test_a_server_on_its_node_restarts_for_a_change_beyond_the_live_fields() -> None:
    loaded = Children(statefulset=True, server_replicas=2, server_holds_a_node=True, server_restart_hash="older")
    assert serving(planned(Step.RUN_WORKERS, loaded, server=True)) == [Serve(2, keep_template=False)]


def test_a_server_on_no_node_yet_takes_the_new_template() -> None:
    pending = Children(statefulset=True, server_replicas=2, server_holds_a_node=False, server_restart_hash=HASH)
    assert serving(planned(Step.WAIT_FOR_SERVER, pending, server=True)) == [Serve(2, keep_template=False)]


# --- a server Kueue admits (docs/kueue.md: it refuses resizes and shape changes in place) ----------

QUEUED = Children(
    statefulset=True,
    server_replicas=2,
    server_restart_hash=HASH,
    server_admission_hash=ADMITTED,
    server_kueue_managed=True,
)


def deleted(actions: list[Action]) -> list[Child]:
    return [a.child for a in actions if isinstance(a, Delete)]


def test_a_queued_server_whose_shape_or_queue_moved_is_made_anew_not_patched() -> None:
    moved = replace(QUEUED, server_admission_hash="admission-0")
    actions = planned(Step.WAIT_FOR_SERVER, moved, server=True)
    assert deleted(actions) == [Child.SERVER_STATEFULSET] and serving(actions) == []
    (delete,) = [a for a in actions if isinstance(a, Delete)]
    assert "Kueue will not change the queue, priority or pod shape" in delete.why


def test_a_queued_server_is_served_again_once_made_anew() -> None:
    assert serving(planned(Step.WAIT_FOR_SERVER, Children(), server=True)) == [Serve(2, keep_template=False)]


def test_a_queued_server_on_its_node_keeps_its_template_so_a_moved_shape_waits_for_its_next_start() -> None:
    loaded = replace(QUEUED, server_holds_a_node=True, server_admission_hash="admission-0")
    actions = planned(Step.RUN_WORKERS, loaded, server=True)
    assert serving(actions) == [Serve(2, keep_template=True)] and deleted(actions) == []


def test_a_queued_statefulset_is_made_anew_for_another_replica_count_but_scaled_up_from_zero() -> None:
    three = parse_spec(unit_spec(**{"server.replicas": 3}))
    resized = planned(Step.RUN_WORKERS, replace(QUEUED, server_holds_a_node=True), spec=three, server=True)
    assert deleted(resized)[-1] == Child.SERVER_STATEFULSET and serving(resized) == []
    stopped = replace(QUEUED, server_replicas=0)  # scaled to 0 by an older operator
    assert serving(planned(Step.WAIT_FOR_SERVER, stopped, server=True)) == [Serve(2, keep_template=False)]


def test_a_queued_server_no_longer_wanted_is_deleted_not_scaled_to_zero() -> None:
    done = planned(Step.DONE, QUEUED)
    assert deleted(done)[-1] == Child.SERVER_STATEFULSET and serving(done) == []
    assert serving(planned(Step.DONE, Children())) == []


def test_a_server_kueue_does_not_manage_is_patched_as_ever() -> None:
    unmanaged = replace(QUEUED, server_kueue_managed=False, server_admission_hash="admission-0")
    assert serving(planned(Step.WAIT_FOR_SERVER, unmanaged, server=True)) == [Serve(2, keep_template=False)]
    three = parse_spec(unit_spec(**{"server.replicas": 3}))
    assert serving(planned(Step.RUN_WORKERS, unmanaged, spec=three, server=True)) == [Serve(3, keep_template=False)]


def test_a_scale_down_deletes_the_services_of_replicas_that_no_longer_exist() -> None:
    spec = parse_spec(unit_spec(**{"server.replicas": 1}))
    actions = planned(Step.RUN_WORKERS, Children(statefulset=True, server_replicas=3), spec=spec, server=True)
    assert [a for a in actions if isinstance(a, Delete)] == [
        Delete(Child.REPLICA_SERVICE, 1),
        Delete(Child.REPLICA_SERVICE, 2),
    ]


def test_going_to_several_nodes_replaces_the_statefulset_and_its_headless_service_with_a_group() -> None:
    spec = parse_spec(unit_spec(**{"server.nodes": 2, "server.tensorParallel": 16}))
    actions = planned(Step.WAIT_FOR_SERVER, Children(statefulset=True, server_replicas=2), spec=spec, server=True)
    assert [a for a in actions if isinstance(a, Delete)] == [
        Delete(Child.SERVER_STATEFULSET),
        Delete(Child.HEADLESS_SERVICE),
    ]
    assert Apply(Child.HEADLESS_SERVICE) not in actions, "LWS makes its own headless Service"
    # The group does not exist yet: no Services of "had" replicas to prune, a new workload served.
    assert serving(actions) == [Serve(2, keep_template=False)]


def test_going_back_to_one_node_deletes_the_group_its_workers_were_left_by() -> None:
    actions = planned(Step.WAIT_FOR_SERVER, Children(group=True, group_workers_left=True), server=True)
    assert Delete(Child.SERVER_GROUP) in actions
    assert Delete(Child.SERVER_GROUP) not in planned(Step.WAIT_FOR_SERVER, Children(group=True), server=True)


# --- the step Jobs ---------------------------------------------------------------------------------


def test_the_preflight_is_created_once_for_its_step() -> None:
    assert steps(planned(Step.PREFLIGHT)) == [Create(Child.PREFLIGHT)]
    assert steps(planned(Step.PREFLIGHT, Children(jobs={Child.PREFLIGHT: CURRENT}))) == []


def test_a_step_job_of_an_older_data_generation_is_deleted_and_not_recreated_in_the_same_pass() -> None:
    assert steps(planned(Step.PREFLIGHT, Children(jobs={Child.PREFLIGHT: OLDER}))) == [Delete(Child.PREFLIGHT)]
    canary = Children(jobs={Child.PREFLIGHT: CURRENT, Child.CANARY: OLDER})
    assert steps(planned(Step.RUN_CANARY, canary, server=True)) == [Delete(Child.CANARY)]
    assert made_for("3", 3) and not made_for("2", 3) and not made_for(None, 3)


def test_a_finished_step_job_whose_pods_went_unread_runs_again() -> None:
    lost = JobState(data_generation="1", finished=True, pods_gone=True)
    actions = steps(planned(Step.PREFLIGHT, Children(jobs={Child.PREFLIGHT: lost})))
    assert actions == [Delete(Child.PREFLIGHT, why="ended, its pods gone unread: it runs again")]


def test_a_lost_pod_of_an_older_data_generation_is_deleted_once() -> None:
    lost = JobState(data_generation="0", finished=True, pods_gone=True)
    assert len(steps(planned(Step.PREFLIGHT, Children(jobs={Child.PREFLIGHT: lost})))) == 1


def test_a_recorded_verdict_keeps_its_job_though_its_pods_are_gone() -> None:
    lost = JobState(data_generation="1", finished=True, pods_gone=True)
    children = Children(jobs={Child.PREFLIGHT: lost, Child.CANARY: lost, Child.VERIFY: lost})
    observed = Observed(generation=1, preflight=PASSED, canary=PASSED, final=PASSED)
    assert steps(planned(Step.DONE, children, observed=observed)) == []


def test_a_halted_run_never_reruns_a_step_whose_pods_are_gone() -> None:
    lost = JobState(data_generation="1", finished=True, pods_gone=True)
    observed = Observed(generation=1, halted=HaltedBefore(reason="CanaryFailed", failed=True))
    assert steps(planned(Step.HALTED, Children(jobs={Child.CANARY: lost}), observed=observed)) == []


def test_once_a_halt_is_recorded_the_refusing_steps_job_goes_and_no_other() -> None:
    refused = JobState(data_generation="1", finished=True, failed=True)
    passed = JobState(data_generation="1", finished=True)
    halted = Observed(generation=1, halted=HaltedBefore(reason="PreflightFailed"))
    children = Children(jobs={Child.PREFLIGHT: refused, Child.CANARY: passed})
    (deleted,) = steps(planned(Step.HALTED, children, observed=halted))
    assert isinstance(deleted, Delete) and deleted.child == Child.PREFLIGHT and "recorded" in deleted.why
    # Before the halt is recorded (the pass that reads the verdict), the Job and its verdict stay.
    reading = Observed(generation=1, preflight=PASSED)
    assert not any(isinstance(a, Delete) for a in steps(planned(Step.HALTED, children, observed=reading)))


def test_a_halt_that_keeps_the_lease_gives_it_back_once_and_a_lifted_halt_clears_the_way() -> None:
    kept = Observed(generation=1, halted=HaltedBefore(reason="ParsersMismatch", lease_kept=True, at=9.0))
    assert steps(planned(Step.HALTED, observed=kept)) == [Create(Child.RELEASE, taken_before=9.0)]
    released = JobState(finished=True)
    for job in (JobState(), released):  # running or done: once per halt
        assert steps(planned(Step.HALTED, Children(jobs={Child.RELEASE: job}), observed=kept)) == []
    given_back = Observed(generation=1, halted=HaltedBefore(reason="CanaryFailed"))
    assert steps(planned(Step.HALTED, observed=given_back)) == [], "the refusing step gave it back itself"
    # The halt lifted (a spec change): the finished Job goes, so a later halt gives its own lease back.
    lifted = steps(planned(Step.PREFLIGHT, Children(jobs={Child.RELEASE: released})))
    assert lifted == [Create(Child.PREFLIGHT), Delete(Child.RELEASE)]
    assert Delete(Child.RELEASE) not in steps(planned(Step.PREFLIGHT, Children(jobs={Child.RELEASE: JobState()})))


def test_the_canary_goes_to_the_ready_servers_or_else_every_url() -> None:
    ready = ServerObservation(2, (ServerInstance("kimi-server-1", running=True, ready=True, endpoint=URLS[1]),))
    observed = Observed(generation=1, server=ready)
    assert steps(planned(Step.RUN_CANARY, server=True, observed=observed)) == [Create(Child.CANARY, (URLS[1],))]
    none_ready = Observed(generation=1, server=ServerObservation(2))
    assert steps(planned(Step.RUN_CANARY, server=True, observed=none_ready)) == [Create(Child.CANARY, tuple(URLS))]
    assert steps(planned(Step.RUN_CANARY, server=True)) == [], "no server observed: no canary"


def test_suspending_deletes_an_unfinished_canary_and_keeps_a_finished_one_only_once_workers_started_on_it() -> None:
    running = Children(jobs={Child.CANARY: CURRENT})
    assert steps(planned(Step.SUSPENDED, running)) == [Delete(Child.CANARY)]
    finished = JobState(data_generation="1", finished=True)
    assert Delete(Child.CANARY) not in steps(
        planned(Step.SUSPENDED, Children(jobs={Child.CANARY: finished, Child.WORKERS: CURRENT}))
    )
    # Bug 5: before any worker, the resume asks the canary again (test_canary_reuse.py): a new Job, not this one.
    assert steps(planned(Step.SUSPENDED, Children(jobs={Child.CANARY: finished}))) == [Delete(Child.CANARY)]


def test_the_workers_job_is_created_with_every_server_url() -> None:
    assert steps(planned(Step.RUN_WORKERS, server=True, workers=True)) == [Create(Child.WORKERS, tuple(URLS))]


def test_the_workers_are_suspended_and_resumed_with_the_decision() -> None:
    running = Children(jobs={Child.WORKERS: JobState(server_urls=",".join(URLS))})
    assert steps(planned(Step.WAIT_FOR_SERVER, running, server=True)) == [SuspendWorkers(True)]
    paused = Children(jobs={Child.WORKERS: JobState(server_urls=",".join(URLS), suspended=True)})
    assert steps(planned(Step.RUN_WORKERS, paused, server=True, workers=True)) == [SuspendWorkers(False)]
    assert steps(planned(Step.RUN_WORKERS, running, server=True, workers=True)) == []


def test_a_changed_server_list_replaces_the_workers_job() -> None:
    older = Children(jobs={Child.WORKERS: JobState(server_urls=URLS[0])})
    assert steps(planned(Step.RUN_WORKERS, older, server=True, workers=True)) == [Delete(Child.WORKERS)]


def test_a_finished_workers_job_is_left_as_it_is() -> None:
    done = Children(jobs={Child.WORKERS: JobState(server_urls=URLS[0], finished=True)})
    assert steps(planned(Step.FINAL_VERIFY, done)) == [Create(Child.VERIFY)]


def test_verify_and_export_are_created_once_for_their_steps() -> None:
    assert steps(planned(Step.FINAL_VERIFY)) == [Create(Child.VERIFY)]
    assert steps(planned(Step.FINAL_VERIFY, Children(jobs={Child.VERIFY: CURRENT}))) == []
    assert steps(planned(Step.EXPORT)) == [Create(Child.EXPORT)]
    assert steps(planned(Step.EXPORT, Children(jobs={Child.EXPORT: CURRENT}))) == []


# --- the spec in force -----------------------------------------------------------------------------


def document(**changes: Any) -> dict[str, Any]:
    return run_manifests.spec_document(parse_spec(unit_spec(**changes)))


def test_a_new_runs_spec_is_in_force_at_its_generation() -> None:
    in_force = spec_in_force(document(), None, None, 4, bulk_started=lambda: False)
    assert (in_force.document, in_force.data_generation, in_force.refused) == (document(), 4, [])


def test_a_data_change_before_bulk_work_is_taken_as_a_new_data_generation() -> None:
    new = document(**{"generation.sampling": {"max_new_tokens": 512}})
    in_force = spec_in_force(new, document(), 1, 2, bulk_started=lambda: False)
    assert (in_force.document, in_force.data_generation, in_force.refused) == (new, 2, [])


def test_a_data_change_after_bulk_work_is_refused_and_live_fields_still_move() -> None:
    new = document(**{"generation.sampling": {"max_new_tokens": 512}, "suspend": True})
    in_force = spec_in_force(new, document(), 1, 2, bulk_started=lambda: True)
    assert in_force.refused == ["spec.generation.sampling.max_new_tokens"], in_force.refused
    assert in_force.data_generation == 1
    assert in_force.document["generation"] == document()["generation"] and in_force.document["suspend"] is True


def test_a_live_change_keeps_the_data_generation() -> None:
    in_force = spec_in_force(document(**{"suspend": True}), document(), 1, 5, bulk_started=lambda: True)
    assert (in_force.data_generation, in_force.refused) == (1, [])


def test_suspend_and_resume_do_not_move_the_generation_a_halt_is_judged_by() -> None:
    first = spec_in_force(document(), None, None, 3, bulk_started=lambda: True)
    assert first.changed_generation == 3
    suspended = spec_in_force(document(**{"suspend": True}), document(), 3, 4, bulk_started=lambda: True,
                              applied_changed_generation=3)  # fmt: skip
    resumed = spec_in_force(document(), document(**{"suspend": True}), 3, 5, bulk_started=lambda: True,
                            applied_changed_generation=3)  # fmt: skip
    assert (suspended.changed_generation, resumed.changed_generation) == (3, 3)
    # Anything else that changes (a live field, the documented retry gesture) is a new spec to judge.
    retried = spec_in_force(document(**{"suspend": True, "clients.concurrency": 9}), document(**{"suspend": True}), 3, 6,
                            bulk_started=lambda: True, applied_changed_generation=3)  # fmt: skip
    assert retried.changed_generation == 6
    # A ConfigMap an older operator wrote (no such annotation): every change counts, as it did then.
    assert (
        spec_in_force(document(**{"suspend": True}), document(), 3, 4, bulk_started=lambda: True).changed_generation
        == 4
    )


def test_spec_applied_shows_a_refusal_with_the_fix_and_clears_only_once_shown() -> None:
    assert spec_applied([], []) == []
    (refused,) = spec_applied(["spec.generation.sampling.max_new_tokens"], [])
    assert (refused.type, refused.status, refused.reason) == ("SpecApplied", "False", "DataFieldsFrozen")
    assert "spec.generation.sampling.max_new_tokens" in refused.message and "new output path" in refused.message
    shown = DataGenRunStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "SpecApplied",
                    "status": "False",
                    "reason": "DataFieldsFrozen",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    )
    (cleared,) = spec_applied([], shown.conditions)
    assert (cleared.status, cleared.reason) == ("True", "Applied")

    # A live field acknowledged is kept until the next change: no Applied flapping back after it.
    acknowledged = DataGenRunStatus.model_validate(
        {"conditions": [{"type": "SpecApplied", "status": "True", "reason": "LiveFieldsApplied",
                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    )  # fmt: skip
    assert spec_applied([], acknowledged.conditions) == []


def test_a_live_change_is_acknowledged_naming_old_new_and_when_it_takes_effect() -> None:
    new = document(**{"clients.concurrency": 64, "checks.maxTruncationRate": 0.2, "suspend": True})
    in_force = spec_in_force(new, document(), 1, 5, bulk_started=lambda: True)
    said_changes = [str(change) for change in in_force.live_changed]
    assert in_force.refused == [] and len(said_changes) == 2, said_changes
    concurrency = next(c for c in said_changes if c.startswith("spec.clients.concurrency"))
    old = document()["clients"]["concurrency"]
    assert concurrency == (
        f"spec.clients.concurrency {old} → 64: takes effect when new worker pods start (a resume or a retry); "
        f"the running workers keep {old}"
    )
    # Named at its leaf, old → new, in words: never the section as JSON.
    assert "spec.checks.maxTruncationRate 0.02 → 0.2: takes effect at once" in "; ".join(said_changes), said_changes
    (said,) = spec_applied([], [], in_force.live_changed)
    assert (said.status, said.reason) == ("True", "LiveFieldsApplied") and concurrency in said.message
    assert "{" not in said.message and '"' not in said.message, said.message
    # On a finished run the change does nothing, and says so.
    (finished,) = spec_applied([], [], in_force.live_changed, finished=True)
    assert "takes effect" not in finished.message and "the run has finished" in finished.message, finished.message
    # Beside a refused data change, the live fields taken are said too.
    frozen = document(**{"clients.concurrency": 64, "generation.sampling": {"max_new_tokens": 7}})
    both = spec_in_force(frozen, document(), 1, 6, bulk_started=lambda: True)
    (refused,) = spec_applied(both.refused, [], both.live_changed)
    assert refused.reason == "DataFieldsFrozen" and "Taken: spec.clients.concurrency" in refused.message
    assert spec_in_force(document(**{"suspend": True}), document(), 1, 7, bulk_started=lambda: True).live_changed == []
    assert spec_in_force(document(**{"suspend": True}), document(), 1, 7, bulk_started=lambda: True).suspend_changed


def test_spec_values_are_said_in_words() -> None:
    from datagen_operator.api.live_fields import words

    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert words([toleration]) == "effect=NoSchedule key=nvidia.com/gpu operator=Exists"
    assert (words(None), words(True), words(0.9), words({}), words([])) == ("unset", "true", "0.9", "none", "none")


# --- the inventory the planner reads (k8s/inventory.py) --------------------------------------------


def job(name: str, *, generation: str = "1", finished: bool = False, **spec: Any) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if finished else []
    return {
        "metadata": {"name": name, "annotations": {object_meta.DATA_GENERATION: generation}},
        "spec": spec,
        "status": {"conditions": conditions},
    }


def pod(name: str, component: str, node: str | None = None) -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": name, "labels": {object_meta.COMPONENT_LABEL: component}}, "spec": spec}


def test_the_inventory_reads_jobs_pods_and_the_server_from_the_cache_objects() -> None:
    jobs = [job("kimi-preflight", finished=True), job("kimi-canary", finished=True), job("kimi-workers", suspend=True)]
    pods = [
        pod("kimi-canary-x", "canary"),
        pod("kimi-server-0", "server", node="gpu-1"),
        pod("kimi-server-1-1", "server"),
    ]
    sts = server_hashes.with_hashes(server_manifests.server_statefulset(object_meta.RunRef("kimi", "ml", "u"), SPEC, 2))
    children = inventory("kimi", jobs, pods, sts, None, grouped=False)
    assert children.jobs == {
        Child.PREFLIGHT: JobState(data_generation="1", finished=True, pods_gone=True),
        Child.CANARY: JobState(data_generation="1", finished=True, pods_gone=False),
        Child.WORKERS: JobState(data_generation="1", suspended=True),
    }
    assert children.statefulset and not children.group and children.group_workers_left
    assert (children.server_replicas, children.server_holds_a_node) == (2, True)
    assert children.server_restart_hash == sts["metadata"]["annotations"][object_meta.RESTART_HASH]


def test_an_auto_runs_workers_job_sends_at_the_canarys_number_remembered_once_its_pod_is_gone() -> None:
    from datagen_operator.api.status import CANARY_PASSED, Condition
    from datagen_operator.control.remembered import remembered_canary
    from datagen_operator.k8s.registry import BuildInputs, build
    from datagen_operator.k8s.status_writer import Facts, StatusWriter

    auto = SPEC.model_copy(update={"clients": SPEC.clients.model_copy(update={"concurrency": "auto"})})
    said = "5/5 canary outputs pass; clients.concurrency auto: 36 per shard x 3 shards for 2 servers of 48 slots"
    from_job = StepOutcome(True, "Passed", said, concurrency=36)  # its termination message, read once
    # The status keeps the number beside CanaryPassed; a later pass reads it back from there.
    writer = StatusWriter(ctx=None, namespace="ml", name="kimi")  # type: ignore[arg-type]  # _status reads no context
    status = writer._status(
        DataGenRunStatus(),
        Decision(step=Step.RUN_WORKERS, workers_wanted=True),
        1,
        datetime.now(UTC),
        [ConditionUpdate(CANARY_PASSED, "True", "Passed", said)],
        Observed(generation=1, canary=from_job),
        Facts(None, None, None),
    )
    assert status.concurrency == 36
    remembered = remembered_canary(status, 1)
    assert remembered is not None and remembered.concurrency == 36
    assert remembered_canary(status.model_copy(update={"conditions": [
        Condition(type=CANARY_PASSED, status="True", reason="Passed", last_transition_time="t", observed_generation=1)
    ]}), 2) is None, "a later data generation runs its own canary"  # fmt: skip

    observed = Observed(generation=1, canary=remembered)
    (create,) = steps(planned(Step.RUN_WORKERS, spec=auto, server=True, workers=True, observed=observed))
    assert create == Create(Child.WORKERS, tuple(URLS), concurrency=36)
    job = build(
        Child.WORKERS, BuildInputs(object_meta.RunRef("kimi", "ml", "u-1"), auto, "img:1", 1, URLS, concurrency=36)
    )
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--concurrency") + 1] == "36"
    # A spec that sets a number (a live change after the canary): the Job's workers send at the spec's.
    fixed = build(
        Child.WORKERS, BuildInputs(object_meta.RunRef("kimi", "ml", "u-1"), SPEC, "img:1", 1, URLS, concurrency=36)
    )
    assert "--concurrency" not in fixed["spec"]["template"]["spec"]["containers"][0]["command"]
