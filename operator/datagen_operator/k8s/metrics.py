"""The operator's Prometheus metrics: every run's conditions and progress, and condition transitions.

Served by `datagen operator --metrics-port`; one registry of our own, so nothing else leaks in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from datagen_operator.api.status import CONDITION_TYPES

REGISTRY = CollectorRegistry(auto_describe=True)
_RUN = ("namespace", "name")

CONDITION = Gauge(
    "datagen_run_condition",
    "1 when the run's condition has this status (True, False, Unknown), else 0.",
    [*_RUN, "type", "status"],
    registry=REGISTRY,
)
PROMPTS_TOTAL = Gauge("datagen_run_prompts_total", "Valid prompts of the run's dataset.", _RUN, registry=REGISTRY)
PROMPTS_DONE = Gauge("datagen_run_prompts_done", "Prompts with every sample recorded.", _RUN, registry=REGISTRY)
RECORDS = Gauge("datagen_run_records", "Records written (all shards).", _RUN, registry=REGISTRY)
TOKENS_PER_SECOND = Gauge(
    "datagen_run_tokens_per_second", "Output tokens per second, all shards.", _RUN, registry=REGISTRY
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
_PER_RUN = (PROMPTS_TOTAL, PROMPTS_DONE, RECORDS, TOKENS_PER_SECOND, PASSES)


def observe_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    """Mirror one run's status (the JSON the operator writes) into the gauges."""
    by_type = {c["type"]: c["status"] for c in status.get("conditions", [])}
    for type_ in CONDITION_TYPES:
        current = by_type.get(type_, "Unknown")
        for value in ("True", "False", "Unknown"):
            CONDITION.labels(namespace, name, type_, value).set(1.0 if current == value else 0.0)
    progress = status.get("progress") or {}
    PROMPTS_TOTAL.labels(namespace, name).set(progress.get("promptsTotal", 0))
    PROMPTS_DONE.labels(namespace, name).set(progress.get("promptsDone", 0))
    RECORDS.labels(namespace, name).set(progress.get("records", 0))
    TOKENS_PER_SECOND.labels(namespace, name).set(progress.get("tokensPerSecond", 0.0))


def count_transition(type_: str, status: str, reason: str) -> None:
    TRANSITIONS.labels(type_, status, reason).inc()


def count_pass(namespace: str, name: str) -> None:
    PASSES.labels(namespace, name).inc()


def forget_run(namespace: str, name: str) -> None:
    """Drop a deleted run's series, so dashboards do not show ghosts."""
    for type_ in CONDITION_TYPES:
        for value in ("True", "False", "Unknown"):
            _remove(CONDITION, namespace, name, type_, value)
    for series in _PER_RUN:
        _remove(series, namespace, name)


def _remove(series: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never observed: nothing to drop
        series.remove(*labels)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address, registry=REGISTRY)
