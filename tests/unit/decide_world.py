"""The observed worlds the decision tests feed `decide`: a Kimi run, its check context, a ready server,
passed steps, a run in flight with given counts."""

from __future__ import annotations

from datagen_operator.api import parse_run
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.checks.evaluate import CheckContext
from datagen_operator.control.observed import (
    Observed,
    ProgressCounters,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from tests.manifests import example_run


def spec(document=None) -> DataGenRunSpec:
    return parse_run(document or example_run()).spec


def context(s: DataGenRunSpec) -> CheckContext:
    return CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, s.checks)


READY = ServerObservation(1, (ServerInstance("srv-0", running=True, ready=True, endpoint="http://srv-0:30000"),))
PASS = StepOutcome(True, "Passed", "ok")


def conditions(decision) -> dict[str, tuple[str, str]]:
    return {u.type: (u.status, u.reason) for u in decision.updates}


def running(counts: Counts, done: int = 0) -> Observed:
    counters = ProgressCounters(prompts_total=100, prompts_done=counts.records, tokens_per_second=5100, counts=counts)
    return Observed(
        1,
        server=READY,
        parsers=PASS,
        canary=PASS,
        workers=WorkersObservation(8, shards_done=done, active=8 - done),
        progress=counters,
    )
