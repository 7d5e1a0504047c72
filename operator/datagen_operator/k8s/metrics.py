"""The operator's Prometheus metrics: every run's phase, conditions, progress, checks and server, and condition
transitions. A run's samples are a pure function of the status the operator writes (`run_samples`); the
gauges only mirror them.

Served by `datagen operator --metrics-port`; one registry of our own, so nothing else leaks in. Every run's
series carry (namespace, name), a check's also `check`: nothing that grows with records or pods.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import CONDITION_TYPES, SERVER_READY, Phase
from datagen_operator.control.observed import ServerObservation

REGISTRY = CollectorRegistry(auto_describe=True)
_RUN = ("namespace", "name")

_RUN_GAUGES: dict[str, Gauge] = {}
"""Every per-run gauge by its name: `Sample.metric` names one."""


def _run_gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> str:
    """A gauge of one run, labelled (namespace, name, *labels); returns its name for `run_samples`."""
    _RUN_GAUGES[name] = Gauge(name, documentation, [*_RUN, *labels], registry=REGISTRY)
    return name


CONDITION = _run_gauge(
    "datagen_run_condition",
    "1 when the run's condition has this status (True, False, Unknown), else 0.",
    ("type", "status"),
)
PHASE = _run_gauge("datagen_run_phase", "1 for the run's status.phase, 0 for every other phase.", ("phase",))
PROMPTS_TOTAL = _run_gauge("datagen_run_prompts_total", "Valid prompts of the run's dataset.")
PROMPTS_DONE = _run_gauge("datagen_run_prompts_done", "Prompts with every sample recorded.")
RECORDS = _run_gauge("datagen_run_records", "Records written (all shards).")
RECORDS_EXPECTED = _run_gauge(
    "datagen_run_records_expected",
    "Records the run must produce (status.progress.recordsTotal: prompts, or turns, x samplesPerPrompt).",
)
RECORDS_DONE = _run_gauge(
    "datagen_run_records_done", "Samples with nothing left to do (recorded, refused or set aside); never goes back."
)
TOKENS_PER_SECOND = _run_gauge("datagen_run_tokens_per_second", "Output tokens per second, all shards.")
CHECK_RATE = _run_gauge(
    "datagen_run_check_rate", "A check's rate over the records so far (status.checks[].rate).", ("check",)
)
CHECK_BOUND = _run_gauge(
    "datagen_run_check_bound",
    "The 95 % confidence bound of a check's rate: the number judged against its threshold.",
    ("check",),
)
CHECK_THRESHOLD = _run_gauge(
    "datagen_run_check_threshold", "A check's threshold (status.checks[].threshold).", ("check",)
)
CHECK_PASSED = _run_gauge("datagen_run_check_passed", "1 while a check passes, else 0.", ("check",))
SERVER_RESTARTS = _run_gauge(
    "datagen_run_server_restarts",
    "Restarts of the run's server containers, summed over its current replicas (the kubelet's restartCount).",
)
QUEUED_SECONDS = _run_gauge(
    "datagen_run_queued_seconds",
    "Seconds the run's server has been waiting for a place (being created, refused by a quota, unschedulable, "
    "pending, queued, preempted or evicted by Kueue), as this operator process saw it; 0 while it does not wait.",
)
TRANSITIONS = Counter(
    "datagen_condition_transitions",
    "Condition transitions the operator wrote (each is also a Kubernetes event).",
    ["type", "status", "reason"],
    registry=REGISTRY,
)
PASSES = Counter(
    "datagen_run_passes",
    "Passes the operator finished over the run (each observes it, decides, acts and reports).",
    _RUN,
    registry=REGISTRY,
)

QUEUED_REASONS = frozenset(
    {
        Reason.CREATING,
        Reason.REFUSED,
        Reason.UNSCHEDULABLE,
        Reason.PENDING,
        Reason.QUEUED,
        Reason.PREEMPTED,
        Reason.EVICTED,
    }
)
"""ServerReady reasons that mean the server waits for a place, not for itself (loading, crashing): Kueue's
admission (Queued) and re-admission after an eviction (Preempted, Evicted) included."""


@dataclass(frozen=True)
class Sample:
    """One series of a run: the metric, its labels after (namespace, name), its value."""

    metric: str
    labels: tuple[str, ...]
    value: float


def run_samples(
    status: Mapping[str, Any], server: ServerObservation | None = None, queued_seconds: float = 0.0
) -> list[Sample]:
    """A run's series from its status (the JSON the operator writes), the server replicas this pass saw and
    how long the server has waited for a place (`queued_since`). Pure."""
    by_type = {c["type"]: c["status"] for c in status.get("conditions", [])}
    samples = [
        Sample(CONDITION, (type_, value), 1.0 if by_type.get(type_, "Unknown") == value else 0.0)
        for type_ in CONDITION_TYPES
        for value in ("True", "False", "Unknown")
    ]
    phase = status.get("phase")
    samples += [Sample(PHASE, (p.value,), 1.0 if p.value == phase else 0.0) for p in Phase]
    progress = status.get("progress") or {}
    samples += [
        Sample(PROMPTS_TOTAL, (), progress.get("promptsTotal", 0)),
        Sample(PROMPTS_DONE, (), progress.get("promptsDone", 0)),
        Sample(RECORDS, (), progress.get("records", 0)),
        Sample(RECORDS_EXPECTED, (), progress.get("recordsTotal", 0)),
        Sample(RECORDS_DONE, (), progress.get("recordsDone", 0)),
        Sample(TOKENS_PER_SECOND, (), progress.get("tokensPerSecond", 0.0)),
    ]
    for check in status.get("checks") or []:
        label = (check["name"],)
        samples.append(Sample(CHECK_PASSED, label, 1.0 if check.get("passed") else 0.0))
        for field, metric in (
            ("rate", CHECK_RATE),
            ("bound", CHECK_BOUND),
            ("threshold", CHECK_THRESHOLD),
        ):
            if check.get(field) is not None:  # not judged yet (too few records): no series rather than a 0
                samples.append(Sample(metric, label, float(check[field])))
    restarts = sum(i.restarts for i in server.instances) if server is not None else 0
    samples.append(Sample(SERVER_RESTARTS, (), restarts))
    samples.append(Sample(QUEUED_SECONDS, (), queued_seconds))
    return samples


def queued_since(status: Mapping[str, Any], since: float | None, now: float) -> float | None:
    """When the run's server began waiting for a place (seconds since the epoch), `since` kept while it still
    waits; None once it does not (it loads, runs, or was never asked for). Pure."""
    ready = next((c for c in status.get("conditions", []) if c["type"] == SERVER_READY), None)
    if ready is None or ready["status"] != "False" or ready.get("reason") not in QUEUED_REASONS:
        return None
    return since if since is not None else now


_SERIES: dict[tuple[str, str], set[tuple[str, tuple[str, ...]]]] = {}
"""Each run's series as last set, so a series the status no longer has (a check gone) is dropped."""


def observe_status(
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    server: ServerObservation | None = None,
    queued_seconds: float = 0.0,
) -> None:
    """Mirror one run's status (the JSON the operator writes) into the gauges."""
    samples = run_samples(status, server, queued_seconds)
    for sample in samples:
        _RUN_GAUGES[sample.metric].labels(namespace, name, *sample.labels).set(sample.value)
    now = {(s.metric, s.labels) for s in samples}
    for metric, labels in _SERIES.get((namespace, name), set()) - now:
        _RUN_GAUGES[metric].remove(namespace, name, *labels)
    _SERIES[(namespace, name)] = now


def count_transition(type_: str, status: str, reason: str) -> None:
    TRANSITIONS.labels(type_, status, reason).inc()


def count_pass(namespace: str, name: str) -> None:
    PASSES.labels(namespace, name).inc()


def forget_run(namespace: str, name: str) -> None:
    """Drop a deleted run's series, so dashboards do not show ghosts."""
    for metric, labels in _SERIES.pop((namespace, name), set()):
        _RUN_GAUGES[metric].remove(namespace, name, *labels)
    with contextlib.suppress(KeyError):  # never counted: nothing to drop
        PASSES.remove(namespace, name)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address, registry=REGISTRY)
