"""Which of a run's children to create, apply, scale or delete: every child rule of the operator, pure.

`plan` reads the decision (control/decide.py) and a summary of the children that exist (`Children`, built by
k8s/inventory.py from the watch cache) and returns actions in the order they are to be sent. The shell
(k8s/reconcile.py) builds the manifest each action names (k8s/registry.py's builders) and sends it; it decides nothing.
lws's planner/executor split is the model: the rules are unit-tested here without a cluster."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from datagen_operator.api.live_fields import LiveChange, changed_data_fields, live_changes, merge_live_fields
from datagen_operator.api.reasons import Reason
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CHILDREN_ACCEPTED, SPEC_APPLIED, Condition
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import Observed


class Child(StrEnum):
    """A child of a run, as the planner names it (the shell knows its kind, name and builder)."""

    WORKER_ACCOUNT = "WorkerAccount"
    WORKER_ROLE = "WorkerRole"
    WORKER_ROLE_BINDING = "WorkerRoleBinding"
    SHARD_PROGRESS = "ShardProgress"
    """One ConfigMap per shard (index), where its worker publishes progress."""
    HEADLESS_SERVICE = "HeadlessService"
    """The single-node server's headless Service (a LeaderWorkerSet makes its own)."""
    REPLICA_SERVICE = "ReplicaService"
    """One Service per server replica (index): the URL the workers and the canary send to."""
    SERVER_STATEFULSET = "ServerStatefulSet"
    SERVER_GROUP = "ServerGroup"
    """The LeaderWorkerSet of a server over several nodes (server.nodes > 1)."""
    PREFLIGHT = "Preflight"
    CANARY = "Canary"
    WORKERS = "Workers"
    VERIFY = "Verify"
    EXPORT = "Export"
    RELEASE = "Release"
    """Gives a halted run's output lease back (HaltedBefore.lease_kept), once per halt."""


STEP_JOBS = (Child.PREFLIGHT, Child.CANARY, Child.VERIFY, Child.EXPORT)
"""The one-shot Jobs whose pods write a verdict (the workers' Job writes progress instead)."""


@dataclass(frozen=True)
class JobState:
    """What the plan needs to know of an existing Job."""

    data_generation: str | None = None
    """Its data-generation annotation: the spec generation of the data fields it was made for."""
    finished: bool = False
    failed: bool = False
    """Finished as Failed (a step's refusing verdict: its pod ended in Error)."""
    pods_gone: bool = False
    """Finished, and none of its pods is left: their verdict went with them, unread."""
    suspended: bool = False
    server_urls: str | None = None
    """The workers' Job: the server URLs it was made with (comma-joined)."""
    queue_name: str | None = None
    """Its Kueue queue label (spec.queue's, or put on by Kueue's `default` LocalQueue): Kueue manages it."""


@dataclass(frozen=True)
class Children:
    """The run's children that exist now (the watch cache, plus the LeaderWorkerSet read once per pass)."""

    jobs: Mapping[Child, JobState] = field(default_factory=dict)
    statefulset: bool = False
    group: bool = False
    group_workers_left: bool = False
    """Worker pods of a server group exist (left when server.nodes went back to 1)."""
    server_replicas: int = 0
    """The replica count of the server workload in use (the group's when server.nodes > 1)."""
    server_holds_a_node: bool = False
    """A server pod is bound to a node: it holds its GPUs, replacing it costs a model load."""
    server_restart_hash: str | None = None
    """The restart hash of the server workload in use (None: none exists)."""
    server_admission_hash: str | None = None
    """Its admission hash (None: none exists, or made before the hash was written)."""
    server_kueue_managed: bool = False
    """It carries Kueue's queue label (from spec.queue, or Kueue's default LocalQueue): Kueue admits it."""


@dataclass(frozen=True)
class WantedServer:
    """The hashes of the server workload the spec asks for now (k8s/server_hashes.with_hashes)."""

    restart_hash: str
    admission_hash: str


@dataclass(frozen=True)
class Apply:
    """Server-side apply of a child the operator owns whole, when it is missing or drifted."""

    child: Child
    index: int = 0


@dataclass(frozen=True)
class Create:
    """Create a Job that is missing (a Job's pod template is immutable: it is never re-applied)."""

    child: Child
    urls: tuple[str, ...] = ()
    """The server URLs its pods send to (canary, workers)."""
    taken_before: float | None = None
    """The release Job: the halt's time; a lease renewed after it (a later attempt's) is kept."""
    concurrency: int | None = None
    """The workers' Job with clients.concurrency auto: the requests in flight per shard the canary resolved."""


@dataclass(frozen=True)
class Delete:
    child: Child
    index: int = 0
    why: str = ""
    """Said in the operator's log (empty: the deletion is routine and not logged)."""


@dataclass(frozen=True)
class Serve:
    """The server workload at `replicas` (0 releases the GPUs), applied or scaled."""

    replicas: int
    keep_template: bool
    """Keep the running pod template: only live fields moved while a server holds its GPUs (a model load).
    The change reaches the next server start; only the replica count may move now."""


@dataclass(frozen=True)
class SuspendWorkers:
    """The workers' Job paused or resumed by its spec.suspend: only one Kueue does not manage."""

    suspend: bool


@dataclass(frozen=True)
class ActivateWorkload:
    """A Job Kueue manages paused (False) or resumed (True) by its Workload's spec.active: Kueue owns the Job's
    spec.suspend and would suspend it again (docs/kueue.md)."""

    child: Child
    workload: str
    active: bool


Action = Apply | Create | Delete | Serve | SuspendWorkers | ActivateWorkload


def made_for(job_data_generation: str | None, data_generation: int) -> bool:
    """Whether a step Job was made for this spec's data fields: one made for an older spec's is not this
    spec's, and its verdict does not apply."""
    return job_data_generation == str(data_generation)


def plan(
    spec: DataGenRunSpec,
    decision: Decision,
    observed: Observed,
    children: Children,
    data_generation: int,
    *,
    urls: Sequence[str],
    server: WantedServer,
) -> list[Action]:
    """The actions that bring the run's children to what `decision` needs. `urls` are the servers' Service
    URLs; `server` the hashes of the server workload the spec wants now."""
    actions: list[Action] = [Apply(Child.WORKER_ACCOUNT), Apply(Child.WORKER_ROLE), Apply(Child.WORKER_ROLE_BINDING)]
    actions += [Apply(Child.SHARD_PROGRESS, index) for index in range(spec.clients.shards)]
    actions += _server(spec, decision, children, server)
    actions += _once(
        [*_requeued(spec, observed, children), *_steps(decision, observed, children, data_generation, urls)]
    )
    return actions


def _requeued(spec: DataGenRunSpec, observed: Observed, children: Children) -> list[Action]:
    """A Job Kueue holds (never admitted, so no pod of it ran) whose queue is not spec.queue is made anew in
    spec.queue's: Kueue does not move a held Job to another queue by itself, and a Job held where no LocalQueue
    takes it (a namespace where Kueue manages every Job) waits for ever."""
    if spec.queue is None:
        return []
    actions: list[Action] = []
    for child, job in children.jobs.items():
        kueue = observed.job_workloads.get(child)
        if kueue is not None and kueue.queued is not None and kueue.active and job.queue_name != spec.queue.name:
            held = f"LocalQueue {job.queue_name}" if job.queue_name else "no LocalQueue"
            actions.append(Delete(child, why=f"is made anew in LocalQueue {spec.queue.name}: Kueue held it in {held}"))
    return actions


def _server(spec: DataGenRunSpec, decision: Decision, children: Children, wanted: WantedServer) -> list[Action]:
    actions: list[Action] = []
    if spec.server.external is not None:
        # The run owns no server. One left from before server.external was set (a data field: changed before
        # bulk work) releases its GPUs; nothing else is created or scaled.
        if (children.statefulset or children.group) and children.server_replicas:
            actions.append(Serve(0, keep_template=True))
        return actions
    grouped = spec.server.nodes > 1
    workload = children.group if grouped else children.statefulset
    if grouped and children.statefulset:
        # server.nodes went above 1: the single-node server and its headless Service make way for the group
        # (LWS makes its own headless Service, one that publishes not-ready leaders to their workers).
        actions += [Delete(Child.SERVER_STATEFULSET), Delete(Child.HEADLESS_SERVICE)]
    if not grouped and children.group_workers_left:
        actions.append(Delete(Child.SERVER_GROUP))  # server.nodes went back to 1
    if not grouped:
        actions.append(Apply(Child.HEADLESS_SERVICE))
    actions += [Apply(Child.REPLICA_SERVICE, index) for index in range(spec.server.replicas)]
    had = children.server_replicas if workload else 0
    # A scale-down leaves Services of replicas that no longer exist.
    actions += [Delete(Child.REPLICA_SERVICE, index) for index in range(spec.server.replicas, had)]
    if workload or decision.server_wanted:
        keep = bool(workload and children.server_holds_a_node and children.server_restart_hash == wanted.restart_hash)
        replicas = spec.server.replicas if decision.server_wanted else 0
        refused = _kueue_refuses(children, wanted, replicas, keep=keep, grouped=grouped) if workload else None
        if refused is not None:
            child = Child.SERVER_GROUP if grouped else Child.SERVER_STATEFULSET
            actions.append(Delete(child, why=f"is made anew: {refused}"))
        else:
            actions.append(Serve(replicas, keep_template=keep))
    return actions


def _kueue_refuses(children: Children, wanted: WantedServer, replicas: int, *, keep: bool, grouped: bool) -> str | None:
    """Why a server Kueue admits is deleted rather than updated, or None. Kueue admits such a workload whole, by
    its queue, priority and pods' shape, and a StatefulSet by its replica count: it refuses to change them in
    place (but to or from 0 replicas), and to scale a set up from 0 before the Workload of its scale-down is
    gone. So the server is deleted, its Workload with it, and made anew when wanted (docs/kueue.md)."""
    if not children.server_kueue_managed:
        return None
    old = children.server_replicas
    if old and not replicas:
        return "stopped: Kueue admits its next start as a new Workload (it will not scale a set up from 0 at once)"
    if not grouped and old and replicas and old != replicas:
        return f"Kueue admits a StatefulSet's {old} replicas as one unit and will not resize it to {replicas}"
    if not keep and children.server_admission_hash not in (None, wanted.admission_hash):
        return "Kueue will not change the queue, priority or pod shape (requests, placement) of a server it admits"
    return None


def _steps(
    decision: Decision, observed: Observed, children: Children, data_generation: int, urls: Sequence[str]
) -> list[Action]:
    actions: list[Action] = []
    jobs = children.jobs
    if observed.halted is not None:
        # The halt and the step's verdict are in the run's status now (remembered_halt): the refusing step's
        # Job goes, so no pod of the run is left in Error for a halt that is already said.
        for step in (Child.PREFLIGHT, Child.CANARY):
            job = jobs.get(step)
            if job is not None and job.failed:
                actions.append(Delete(step, why="its refusal is recorded in the run's status"))
    else:
        verdicts = {
            Child.PREFLIGHT: observed.preflight,
            Child.CANARY: observed.canary,
            Child.VERIFY: observed.final,
            Child.EXPORT: observed.export,
        }
        for step in STEP_JOBS:
            job = jobs.get(step)
            if verdicts[step] is None and job is not None and job.pods_gone:
                # Its pods went before their verdict was read (the operator was away): the step runs again,
                # rather than read as a failure. A recorded verdict never gets here (remembered first).
                actions.append(Delete(step, why="ended, its pods gone unread: it runs again"))

    preflight = jobs.get(Child.PREFLIGHT)
    if preflight is not None and not made_for(preflight.data_generation, data_generation):
        actions.append(Delete(Child.PREFLIGHT))
    elif decision.step == Step.PREFLIGHT and preflight is None:
        actions.append(Create(Child.PREFLIGHT))

    canary = jobs.get(Child.CANARY)
    stale = canary is not None and not made_for(canary.data_generation, data_generation)
    # Suspended: an unfinished canary goes, and a finished one too while no worker started on its verdict (on
    # resume the canary is asked again: control/remembered.py `canary_in_force`).
    unused = canary is not None and (not canary.finished or Child.WORKERS not in jobs)
    if stale or (decision.step == Step.SUSPENDED and unused):
        actions.append(Delete(Child.CANARY))
    elif decision.canary_wanted and canary is None and observed.server:
        actions.append(Create(Child.CANARY, tuple(observed.server.ready_endpoints) or tuple(urls)))

    workers = jobs.get(Child.WORKERS)
    if workers is None and decision.workers_wanted:
        resolved = observed.canary.concurrency if observed.canary is not None else None
        actions.append(Create(Child.WORKERS, tuple(urls), concurrency=resolved))
    elif workers is not None and not workers.finished:
        if workers.server_urls != ",".join(urls):
            # The server list changed (replicas): workers drain, a new Job resumes every shard.
            actions.append(Delete(Child.WORKERS))
        elif (kueue := observed.job_workloads.get(Child.WORKERS)) is not None:
            # Kueue owns the Job's spec.suspend: paused and resumed through its Workload.
            if kueue.active != decision.workers_wanted:
                actions.append(ActivateWorkload(Child.WORKERS, kueue.workload, decision.workers_wanted))
        elif workers.queue_name is None and workers.suspended != (not decision.workers_wanted):
            # (A Job with Kueue's queue label whose Workload is not read yet is left to Kueue.)
            actions.append(SuspendWorkers(not decision.workers_wanted))

    release = jobs.get(Child.RELEASE)
    if observed.halted is not None and observed.halted.lease_kept and release is None:
        actions.append(Create(Child.RELEASE, taken_before=observed.halted.at))
    elif observed.halted is None and release is not None and release.finished:
        actions.append(Delete(Child.RELEASE))  # the halt is lifted: a later one gives its lease back anew

    if decision.step == Step.FINAL_VERIFY and Child.VERIFY not in jobs:
        actions.append(Create(Child.VERIFY))
    if decision.step == Step.EXPORT and Child.EXPORT not in jobs:
        actions.append(Create(Child.EXPORT))
    return _once(actions)


def _once(actions: list[Action]) -> list[Action]:
    """A child deleted twice in a pass (its pods gone, and made for an older spec) is deleted once."""
    out: list[Action] = []
    for action in actions:
        if not (isinstance(action, Delete) and any(isinstance(a, Delete) and a.child == action.child for a in out)):
            out.append(action)
    return out


# --- the spec in force (the run's spec ConfigMap) --------------------------------------------------


@dataclass(frozen=True)
class SpecInForce:
    document: dict[str, Any]
    """The spec the run follows (normalized JSON): the new one, or the applied one with live fields moved."""
    data_generation: int
    """The generation of its data-affecting part (what step Jobs are annotated with)."""
    refused: list[str]
    """Data fields changed after bulk records were written, kept at their applied values."""
    live_changed: list[LiveChange] = field(default_factory=list)
    """Live fields this generation changed (api/live_fields.live_changes): old → new, and when each takes effect."""
    changed_generation: int = 0
    """The last generation that changed more than `spec.suspend`: a halt decided at or after it stands
    (remembered_halt), so suspending and resuming a halted run neither reopens it nor reloads a model."""
    suspend_changed: bool = False
    """This generation turned `spec.suspend` on or off (acknowledged on a halted run: `suspend_on_halt`)."""


def spec_in_force(
    new: dict[str, Any],
    applied: dict[str, Any] | None,
    applied_data_generation: int | None,
    generation: int,
    *,
    bulk_started: Callable[[], bool],
    applied_changed_generation: int | None = None,
) -> SpecInForce:
    """Once bulk records exist, a change of a data field (api/live_fields.py) is refused so the output never
    mixes two configurations; before, it is taken and the steps run again (a new data generation)."""
    if applied is None:
        return SpecInForce(new, generation, [], [], generation)
    data_generation = applied_data_generation if applied_data_generation is not None else generation
    only_suspend = _without_suspend(new) == _without_suspend(applied)
    changed_generation = applied_changed_generation if only_suspend and applied_changed_generation else generation
    changed = changed_data_fields(new, applied)
    refused: list[str] = []
    document = new
    if changed and bulk_started():  # asked only for a change: it reads every shard's progress
        refused, document = changed, merge_live_fields(new, applied)
    elif changed:
        data_generation = generation
    suspend_changed = bool(new.get("suspend")) != bool(applied.get("suspend"))
    return SpecInForce(
        document, data_generation, refused, live_changes(new, applied), changed_generation, suspend_changed
    )


def _without_suspend(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "suspend"}


def spec_applied(
    refused: Sequence[str],
    conditions: Sequence[Condition],
    live_changed: Sequence[LiveChange] = (),
    *,
    finished: bool = False,
) -> list[ConditionUpdate]:
    """SpecApplied: False while a data change is refused (naming the fields and the fix); True with the live
    fields just changed and when each takes effect (LiveFieldsApplied, kept until the next change; on a
    `finished` run, that it changes nothing); True Applied once a refused spec is written again (only when a
    refusal was shown)."""
    changes = [change.said(finished) for change in live_changed]
    if refused:
        message = (
            f"{', '.join(refused)} changed after bulk records were written; the run keeps its applied spec so the "
            "output never mixes two configurations. Revert the change, or create a new run with a new output path."
        )
        live = f" Taken: {'; '.join(changes)}." if changes else ""
        return [ConditionUpdate(SPEC_APPLIED, "False", Reason.DATA_FIELDS_FROZEN, message + live)]
    if changes:
        return [ConditionUpdate(SPEC_APPLIED, "True", Reason.LIVE_FIELDS_APPLIED, "; ".join(changes))]
    shown = next((c for c in conditions if c.type == SPEC_APPLIED), None)
    if shown is not None and shown.status == "False":
        return [ConditionUpdate(SPEC_APPLIED, "True", Reason.APPLIED, "the spec in force is the one written")]
    return []


def suspend_on_halt(suspend: bool, halt_reason: str) -> ConditionUpdate:
    """SpecApplied when `spec.suspend` is turned on or off on a halted run: nothing runs to suspend or resume (the
    server is at 0, the workers stopped), and the halt stands until a change beyond `spec.suspend`
    (remembered_halt); the suspend is kept in the spec in force, so a run whose halt is lifted while it is set
    starts suspended."""
    if suspend:
        reason = Reason.SUSPEND_ON_HALT
        message = (
            f"spec.suspend false → true on a run halted ({halt_reason}): nothing runs to suspend (no server, no "
            "workers). The suspend is recorded: if a change beyond spec.suspend lifts the halt, the run starts "
            "suspended"
        )
    else:
        reason = Reason.RESUME_ON_HALT
        message = (
            f"spec.suspend true → false on a run halted ({halt_reason}): there is nothing to resume; the halt "
            "stands until the spec changes beyond spec.suspend"
        )
    return ConditionUpdate(SPEC_APPLIED, "True", reason, message)


def children_accepted(refused: Mapping[str, str], conditions: Sequence[Condition]) -> list[ConditionUpdate]:
    """ChildrenAccepted: False while the API server refuses a child or a Job's pod, in its own words; True once
    none is refused (only when it was shown before: a run that never had a refusal carries no such condition)."""
    if refused:
        message = "; ".join(f"{key}: {words}" for key, words in sorted(refused.items()))
        return [ConditionUpdate(CHILDREN_ACCEPTED, "False", Reason.REFUSED, message[:2000])]
    if any(c.type == CHILDREN_ACCEPTED for c in conditions):
        return [
            ConditionUpdate(
                CHILDREN_ACCEPTED, "True", Reason.ACCEPTED, "the API server accepted every child of the run"
            )
        ]
    return []
