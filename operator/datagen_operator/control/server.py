"""ServerReady from what the shell saw of the server replicas (pods or processes)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from datagen_operator.api.duration import format_duration
from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import SERVER_READY, ConditionStatus
from datagen_operator.api.words import plural
from datagen_operator.control.conditions import ConditionUpdate, never_fits
from datagen_operator.control.observed import KueueEvicted, KueueQueued, ServerInstance, ServerObservation

_CRASH_REASONS = frozenset({"CrashLoopBackOff", "Error", "RunContainerError"})
_IMAGE_REASONS = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
_CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError"})


LOADING_REPORT_S = 30.0
"""How often a log that shows only transitions repeats ServerReady's Loading message: a model takes minutes
to load, and a line every half minute says it still does (at least once a minute, whatever the poll)."""


def loading_line_due(reason: str, said_at: float | None, now: float) -> bool:
    """Whether to repeat the Loading message now; `said_at` is when it was last shown (monotonic seconds)."""
    return reason == Reason.LOADING and (said_at is None or now - said_at >= LOADING_REPORT_S)


@dataclass(frozen=True)
class ServerVerdict:
    condition: ConditionUpdate
    fatal: bool
    """The server cannot become ready without a change (startup budget spent): stop and release the GPUs."""


def _crash_message(instance: ServerInstance) -> str:
    why = instance.last_exit or "no exit status yet"
    return f"{instance.name} exited ({why}) and restarted {plural(instance.restarts, 'time')}"


NEVER_FITS_HINT = (
    "No node can take this pod as asked, even with every other pod gone: ask for what one node has "
    "(server.gpus, cpu, memory; server.nodes > 1 spreads a server over nodes), or check server.nodeSelector, "
    "affinity and tolerations."
)


def _unschedulable_message(instance: ServerInstance) -> str:
    """The scheduler's own words, and what to change when waiting will not help."""
    words = instance.unschedulable_message or ""
    hint = f" {NEVER_FITS_HINT}" if never_fits(words) else ""
    return f"{instance.name}: {words}{hint}"


def _where(local_queue: str, cluster_queue: str | None) -> str:
    return f"LocalQueue {local_queue}" + (f" (ClusterQueue {cluster_queue})" if cluster_queue else "")


def queued_message(queued: tuple[KueueQueued, ...], wanted: int) -> str:
    """Where the server waits and, in Kueue's words, what is short; with several groups, how many wait."""
    first = queued[0]
    where = _where(first.local_queue, first.cluster_queue)
    words = first.message or "waiting for Kueue to consider it"
    if first.kueue_reason != "Pending":
        words = f"{first.kueue_reason}: {words}"
    groups = f"{len(queued)} of {wanted} server groups " if len(queued) > 1 else ""
    return f"{groups}queued by Kueue in {where}: {words}"


def evicted_message(evicted: tuple[KueueEvicted, ...], wanted: int) -> str:
    """Who took the server's place, in Kueue's words, and what it waits for now; with several groups, how many."""
    first = evicted[0]
    where = _where(first.local_queue, first.cluster_queue)
    what = "preempted" if first.preempted else f"evicted ({first.kueue_reason})"
    words = first.message or first.kueue_reason
    waiting = first.waiting or "requeued"
    groups = f"{len(evicted)} of {wanted} server groups " if len(evicted) > 1 else ""
    made_room = f" to make room for {first.preempted_for}" if first.preempted_for else ""
    return f"{groups}{what} by Kueue in {where}{made_room}: {words}; waiting for re-admission: {waiting}"


def server_verdict(observed: ServerObservation | None, startup_timeout_s: float) -> ServerVerdict:
    """ServerReady from what the server's pods, its set and Kueue show; `fatal` once its startup budget is spent."""
    found = _server_verdict(observed, startup_timeout_s)
    if observed is None or observed.kueue_unread is None:
        return found
    # Whatever else the server shows, a queue the run names but Kueue's objects cannot confirm is said beside it.
    said = found.condition
    return replace(found, condition=replace(said, message=f"{said.message} ({observed.kueue_unread})"))


def _verdict(status: ConditionStatus, reason: str, message: str, fatal: bool = False) -> ServerVerdict:
    return ServerVerdict(ConditionUpdate(SERVER_READY, status, reason, message), fatal)


EXTERNAL_NOT_OWNED = "not the run's: it never starts, scales or stops it"


def released_message(why: str, *, external: bool) -> str:
    """ServerReady's words once the run needs no server: its own is stopped, an external one is left alone."""
    if external:
        return f"{why}; the external server is no longer used and keeps running ({EXTERNAL_NOT_OWNED})"
    return f"{why}; server stopped and GPUs released"


def _external_verdict(observed: ServerObservation, startup_timeout_s: float) -> ServerVerdict:
    """server.external: the URLs answer /health_generate or not; there are no pods to read."""
    instances = observed.instances
    ready = [i.name for i in instances if i.ready]
    silent = [i.name for i in instances if not i.ready]
    if ready and not silent:
        return _verdict(
            "True",
            Reason.EXTERNAL_SERVER_READY,
            f"external server {', '.join(ready)} answers /health_generate ({EXTERNAL_NOT_OWNED})",
        )
    if ready:
        return _verdict(
            "True",
            Reason.DEGRADED,
            f"{len(ready)}/{len(instances)} external servers answer /health_generate; workers use those; "
            f"not answering: {', '.join(silent)}",
        )
    waited = max((i.loading_seconds or 0.0 for i in instances), default=0.0)
    budget = format_duration(startup_timeout_s)
    if waited > startup_timeout_s:
        return _verdict(
            "False",
            Reason.STARTUP_TIMEOUT,
            f"no external server answered /health_generate within server.startupTimeout ({budget}): "
            f"{', '.join(silent)}; check that it runs and that the run's pods can reach it",
            fatal=True,
        )
    return _verdict(
        "False",
        Reason.EXTERNAL_SERVER_UNREACHABLE,
        f"waiting for the external server to answer /health_generate: {', '.join(silent)} "
        f"({format_duration(round(waited))} of server.startupTimeout {budget})",
    )


def _server_verdict(observed: ServerObservation | None, startup_timeout_s: float) -> ServerVerdict:
    verdict = _verdict
    if observed is None:
        return verdict("False", Reason.CREATING, "creating 1 server replica(s)")
    if observed.external:
        return _external_verdict(observed, startup_timeout_s)
    instances = observed.instances
    wanted = observed.replicas_wanted
    ready = [i for i in instances if i.ready]
    if observed.refused and not ready:
        # Not fatal: a quota frees up, a policy is fixed; the controller keeps retrying and so does the run.
        return verdict("False", Reason.REFUSED, observed.refused)
    if observed.evicted and not ready:
        # Before the pods' own state: Kueue deletes an evicted server's pods (they would read as crashed or
        # being created) and gates their successors until it admits the server again. Until then the eviction is
        # the cause, also once requeued, and no startup budget or retry is spent. A ready group of a
        # LeaderWorkerSet whose other group was evicted serves on (Degraded).
        reason = Reason.PREEMPTED if observed.evicted[0].preempted else Reason.EVICTED
        return verdict("False", reason, evicted_message(observed.evicted, wanted))
    if observed.queued and not ready:
        # Before the pods' own state: Kueue's gate keeps them unscheduled, which is waiting, not a failure.
        return verdict("False", Reason.QUEUED, queued_message(observed.queued, wanted))
    if not instances:
        return verdict("False", Reason.CREATING, f"creating {plural(wanted, 'server replica')}")

    unschedulable = [i for i in instances if not i.scheduled and i.unschedulable_message]
    if unschedulable and not ready:
        return verdict("False", Reason.UNSCHEDULABLE, _unschedulable_message(unschedulable[0]))
    invalid = [i for i in instances if i.last_exit and "invalid choice" in i.last_exit]
    if invalid and not ready:
        return verdict("False", Reason.INVALID_ARGS, f"the server refused its arguments: {_crash_message(invalid[0])}")
    for reasons, reason in ((_IMAGE_REASONS, Reason.IMAGE_PULL), (_CONFIG_REASONS, Reason.CONTAINER_CONFIG)):
        stuck = [i for i in instances if i.waiting_reason in reasons]
        if stuck and not ready:
            return verdict("False", reason, f"{stuck[0].name}: {stuck[0].waiting_reason}")
    crashing = [i for i in instances if i.waiting_reason in _CRASH_REASONS or (i.last_exit and not i.running)]
    if crashing and not ready:
        return verdict("False", Reason.CRASH_LOOP, _crash_message(crashing[0]))

    if len(ready) >= wanted:
        return verdict(
            "True", Reason.READY, f"{len(ready)}/{plural(wanted, 'replica')} ready; /health_generate answers"
        )
    if ready:
        return verdict(
            "True", Reason.DEGRADED, f"{len(ready)}/{plural(wanted, 'replica')} ready; workers use the ready ones"
        )

    loading = [i for i in instances if i.loading_seconds is not None]
    if loading:
        first = max(loading, key=lambda i: i.loading_seconds or 0.0)
        longest = first.loading_seconds or 0.0
        budget = format_duration(startup_timeout_s)
        if longest > startup_timeout_s:
            return verdict(
                "False",
                Reason.STARTUP_TIMEOUT,
                f"the model did not load within server.startupTimeout ({budget}); raise it or check the server logs",
                fatal=True,
            )
        return verdict(
            "False",
            Reason.LOADING,
            # The budget counts per start: a replica that restarts (a drained node) starts its own anew.
            f"loading the model: {format_duration(round(longest))} of server.startupTimeout {budget}, "
            f"counted from {first.name}'s start",
        )
    if unschedulable:
        return verdict("False", Reason.UNSCHEDULABLE, _unschedulable_message(unschedulable[0]))
    return verdict("False", Reason.PENDING, f"0/{plural(wanted, 'replica')} started")
