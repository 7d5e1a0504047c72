"""Kubernetes-convention conditions: set without losing lastTransitionTime, and events from transitions."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import (
    CONDITION_TYPES,
    PROGRESSING,
    SERVER_READY,
    SUCCEEDED,
    Condition,
    ConditionStatus,
)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ConditionUpdate:
    """What a decision says about one condition; the time and generation are filled in by `apply_updates`."""

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def find(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def apply_updates(
    conditions: Sequence[Condition], updates: Iterable[ConditionUpdate], now: datetime, generation: int | None
) -> list[Condition]:
    """New condition list: lastTransitionTime moves only when the status changes; order follows CONDITION_TYPES."""
    by_type = {c.type: c for c in conditions}
    for update in updates:
        old = by_type.get(update.type)
        kept = old.last_transition_time if old is not None and old.status == update.status else None
        by_type[update.type] = Condition(
            type=update.type,
            status=update.status,
            reason=update.reason,
            message=update.message,
            last_transition_time=kept or rfc3339(now),
            observed_generation=generation,
        )
    order = {name: index for index, name in enumerate(CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c.type, len(order)), c.type))


@dataclass(frozen=True)
class Event:
    """A Kubernetes event (or a line in the local runner's log) for one transition."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def transition_events(before: Sequence[Condition], after: Sequence[Condition]) -> list[Event]:
    """One event per condition whose status or reason changed."""
    events = []
    for condition in after:
        old = find(before, condition.type)
        if old is not None and (old.status, old.reason) == (condition.status, condition.reason):
            continue
        events.append(
            Event(
                type="Warning" if needs_a_person(condition, after) else "Normal",
                reason=f"{condition.type}{condition.reason}"
                if len(condition.type + condition.reason) < 120
                else condition.reason,
                message=f"{condition.type}={condition.status} ({condition.reason}): {condition.message}"[:1024],
            )
        )
    return events


def needs_a_person(condition: Condition, after: Sequence[Condition]) -> bool:
    """Whether a transition is a Warning: only what a person must act on, once. A halt is warned of by
    Succeeded=False alone (Progressing=False says the same and stays Normal); a server waiting for resources
    the cluster has but are in use (the scheduler's "Insufficient nvidia.com/gpu") is the normal state of a
    shared cluster, not a problem; a taint, a selector or an affinity that no node meets is."""
    if condition.status != "False" or condition.reason in _EXPECTED_FALSE_REASONS:
        return False
    if condition.type == PROGRESSING:
        succeeded = find(after, SUCCEEDED)
        return succeeded is None or succeeded.status != "False"
    if condition.type == SERVER_READY and condition.reason == Reason.UNSCHEDULABLE:
        return not waiting_for_resources(condition.message)
    return True


_INSUFFICIENT = re.compile(r"\b\d+ Insufficient \S")
_NODES = re.compile(r"\b0/(\d+) nodes are available")
_HOPELESS = re.compile(r"\b(\d+) Preemption is not helpful for scheduling")


def waiting_for_resources(scheduler_message: str) -> bool:
    """The scheduler's words say only that resources are in use ("0/4 nodes are available: 2 Insufficient
    nvidia.com/gpu, 2 node(s) had untolerated taint ..." counts: some node has the shape, its GPUs are busy),
    and some node could take the pod once they are free (never_fits)."""
    before = scheduler_message.split("preemption:")[0]
    return _INSUFFICIENT.search(before) is not None and not never_fits(scheduler_message)


def never_fits(scheduler_message: str) -> bool:
    """No node can ever take the pod as asked. The scheduler's preemption pass says so per node: "Preemption is
    not helpful for scheduling" for a node where even every other pod gone would not make room (more GPUs than it
    has, a taint, a selector: unresolvable), "No preemption victims found" for one that is only busy."""
    preemption = scheduler_message.partition("preemption:")[2]
    nodes, hopeless = _NODES.search(preemption), _HOPELESS.search(preemption)
    return nodes is not None and hopeless is not None and int(hopeless.group(1)) >= int(nodes.group(1))


# False for these reasons is a normal step of a healthy run, not a problem to warn about. Released: every run
# gives its GPUs back when its shards are done (a halt is warned of by Succeeded=False, not by the release).
# Queued: the run waits its turn for quota, as a shared cluster means it to. Preempted: Kueue gave the run's GPUs to a workload of higher priority, as its queue's policy says; the run
# resumes once re-admitted (an eviction for another cause, Evicted, may need a person and stays a Warning).
_EXPECTED_FALSE_REASONS = frozenset(
    {
        Reason.PENDING,
        Reason.LOADING,
        Reason.WAITING,
        Reason.NOT_STARTED,
        Reason.SUSPENDED,
        Reason.COMPLETED,
        Reason.RUNNING,
        Reason.CREATING,
        Reason.RELEASED,
        Reason.QUEUED,
        Reason.PREEMPTED,
    }
)
