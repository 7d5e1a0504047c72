"""The run's CPU Jobs where Kueue manages Jobs (docs/kueue.md, "The run's CPU Jobs"), pure.

A Job Kueue manages is created suspended by Kueue's webhook and unsuspended on admission, so Kueue owns its
`spec.suspend`: a Job Kueue holds is waiting, not broken (no pod, so no retry is spent and no step has a
timeout to run out), and the run says where it waits and why (`with_jobs_queued`). Pausing and resuming such a
Job goes through its Workload's `spec.active` (k8s/children.py `ActivateWorkload`), never its suspend."""

from __future__ import annotations

from dataclasses import replace

from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import PROGRESSING
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import KueueQueued, Observed
from datagen_operator.control.server import queued_message
from datagen_operator.k8s.children import Child

JOB_OF_STEP: dict[Step, tuple[Child, str]] = {
    Step.PREFLIGHT: (Child.PREFLIGHT, "preflight"),
    Step.RUN_CANARY: (Child.CANARY, "canary"),
    Step.RUN_WORKERS: (Child.WORKERS, "workers'"),
    Step.FINAL_VERIFY: (Child.VERIFY, "final verification"),
    Step.EXPORT: (Child.EXPORT, "export"),
}
"""The Job each step waits on, and how the message names it."""

NO_QUEUE_FIX = (
    "Kueue manages every Job in this namespace and this one names no LocalQueue (the namespace has no LocalQueue "
    "named 'default'), so it never runs: set spec.queue to a LocalQueue of this namespace"
)


def job_queued_message(what: str, queued: KueueQueued) -> str:
    """Where the Job waits and, in Kueue's words, what is short; the fix when it names no LocalQueue at all."""
    if not queued.local_queue:
        return f"the {what} Job waits: {NO_QUEUE_FIX}"
    return f"the {what} Job is {queued_message((queued,), 1)}"


def with_jobs_queued(decision: Decision, observed: Observed) -> Decision:
    """The decision with Progressing=False Queued while Kueue holds the Job its step waits on (a Workload not
    admitted, not deactivated by the operator); else the decision as it is."""
    step = JOB_OF_STEP.get(decision.step)
    if step is None:
        return decision
    child, what = step
    job = observed.job_workloads.get(child)
    if job is None or job.queued is None or not job.active:
        return decision
    queued = ConditionUpdate(PROGRESSING, "False", Reason.QUEUED, job_queued_message(what, job.queued))
    return replace(decision, updates=(*(u for u in decision.updates if u.type != PROGRESSING), queued))
