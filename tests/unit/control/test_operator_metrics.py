"""The operator's Prometheus metrics: a pure function of a run's status (and its server's restarts, its time
waiting for a place), mirrored into gauges that forget deleted runs and checks gone from the status."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from datagen_operator.api.status import Phase
from datagen_operator.control.observed import ServerInstance, ServerObservation
from datagen_operator.k8s import metrics


def exposition() -> str:
    return generate_latest(metrics.REGISTRY).decode()


def test_status_is_mirrored_and_forgotten() -> None:
    status = {
        "conditions": [{"type": "ServerReady", "status": "True"}, {"type": "CanaryPassed", "status": "False"}],
        "progress": {"promptsTotal": 100, "promptsDone": 40, "records": 40, "tokensPerSecond": 5100.0},
    }
    metrics.observe_status("llm", "run-a", status)
    text = exposition()
    assert 'datagen_run_condition{name="run-a",namespace="llm",status="True",type="ServerReady"} 1.0' in text
    assert 'datagen_run_condition{name="run-a",namespace="llm",status="False",type="CanaryPassed"} 1.0' in text
    assert 'datagen_run_condition{name="run-a",namespace="llm",status="Unknown",type="Succeeded"} 1.0' in text
    assert 'datagen_run_prompts_done{name="run-a",namespace="llm"} 40.0' in text
    assert 'datagen_run_tokens_per_second{name="run-a",namespace="llm"} 5100.0' in text
    metrics.forget_run("llm", "run-a")
    assert 'name="run-a"' not in exposition()


def test_transitions_are_counted() -> None:
    """Counted from whatever earlier tests in this process left (the registry is the process's)."""
    labels = {"type": "CanaryPassed", "status": "False", "reason": "Failed"}
    before = metrics.REGISTRY.get_sample_value("datagen_condition_transitions_total", labels) or 0.0
    metrics.count_transition("CanaryPassed", "False", "Failed")
    metrics.count_transition("CanaryPassed", "False", "Failed")
    assert metrics.REGISTRY.get_sample_value("datagen_condition_transitions_total", labels) == before + 2
    assert 'datagen_condition_transitions_total{reason="Failed",status="False",type="CanaryPassed"}' in exposition()


RUNNING = {
    "phase": "Running",
    "conditions": [{"type": "ServerReady", "status": "True", "reason": "Ready"}],
    "progress": {"recordsTotal": 800, "recordsDone": 200, "records": 190, "tokensPerSecond": 900.5},
    "checks": [
        {"name": "termination", "passed": True, "rate": 0.01, "bound": 0.02, "threshold": 0.05},
        {"name": "truncation", "passed": True, "total": 3},  # too few records to judge: no rate yet
    ],
}


def by_series(samples: list[metrics.Sample]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.metric, s.labels): s.value for s in samples}


def test_run_samples_are_the_status_phase_progress_checks_and_server() -> None:
    server = ServerObservation(
        replicas_wanted=2, instances=(ServerInstance("s-0", restarts=2), ServerInstance("s-1", restarts=1))
    )
    samples = by_series(metrics.run_samples(RUNNING, server, queued_seconds=0.0))
    assert samples[("datagen_run_phase", ("Running",))] == 1.0
    assert {labels for (metric, labels), value in samples.items() if metric == "datagen_run_phase" and value} == {
        ("Running",)
    }
    assert len([m for m, _ in samples if m == "datagen_run_phase"]) == len(Phase)
    assert samples[("datagen_run_records_expected", ())] == 800
    assert samples[("datagen_run_records_done", ())] == 200
    assert samples[("datagen_run_records", ())] == 190
    assert samples[("datagen_run_tokens_per_second", ())] == 900.5
    assert samples[("datagen_run_check_rate", ("termination",))] == 0.01
    assert samples[("datagen_run_check_bound", ("termination",))] == 0.02
    assert samples[("datagen_run_check_threshold", ("termination",))] == 0.05
    assert samples[("datagen_run_check_passed", ("termination",))] == 1.0
    assert samples[("datagen_run_check_passed", ("truncation",))] == 1.0
    assert ("datagen_run_check_rate", ("truncation",)) not in samples  # no 0 that reads as a measured rate
    assert samples[("datagen_run_server_restarts", ())] == 3
    assert samples[("datagen_run_queued_seconds", ())] == 0.0
    assert samples[("datagen_run_condition", ("ServerReady", "True"))] == 1.0


def test_a_new_run_has_zeros_and_no_phase() -> None:
    samples = by_series(metrics.run_samples({}))
    assert not any(value for (metric, _), value in samples.items() if metric == "datagen_run_phase")
    assert samples[("datagen_run_server_restarts", ())] == 0
    assert not [m for m, _ in samples if m.startswith("datagen_run_check_")]


def server_ready(status: str, reason: str) -> dict[str, Any]:
    return {"conditions": [{"type": "ServerReady", "status": status, "reason": reason}]}


def test_the_queue_clock_runs_while_the_server_waits_for_a_place() -> None:
    assert metrics.queued_since(server_ready("False", "NotStarted"), None, 100.0) is None  # the preflight's time
    since = metrics.queued_since(server_ready("False", "Creating"), None, 100.0)
    assert since == 100.0
    assert metrics.queued_since(server_ready("False", "Unschedulable"), since, 160.0) == 100.0
    assert metrics.queued_since(server_ready("False", "Refused"), since, 170.0) == 100.0
    assert metrics.queued_since(server_ready("False", "Pending"), since, 180.0) == 100.0
    assert metrics.queued_since(server_ready("False", "Loading"), since, 200.0) is None  # placed: loading
    assert metrics.queued_since(server_ready("True", "Ready"), None, 300.0) is None
    assert metrics.queued_since(server_ready("False", "Unschedulable"), None, 400.0) == 400.0  # evicted: anew
    assert metrics.queued_since({}, None, 0.0) is None


def test_a_check_gone_from_the_status_loses_its_series() -> None:
    metrics.observe_status("llm", "run-b", RUNNING, queued_seconds=12.0)
    text = exposition()
    assert 'datagen_run_check_threshold{check="termination",name="run-b",namespace="llm"} 0.05' in text
    assert 'datagen_run_phase{name="run-b",namespace="llm",phase="Running"} 1.0' in text
    assert 'datagen_run_queued_seconds{name="run-b",namespace="llm"} 12.0' in text
    metrics.observe_status("llm", "run-b", {**RUNNING, "checks": []})
    assert 'check="termination",name="run-b"' not in exposition()
    metrics.forget_run("llm", "run-b")
    assert 'name="run-b"' not in exposition()


def test_passes_are_counted_per_run_and_forgotten_with_it() -> None:
    labels = {"namespace": "llm", "name": "run-p"}
    assert metrics.REGISTRY.get_sample_value("datagen_run_passes_total", labels) is None
    metrics.count_pass("llm", "run-p")
    metrics.count_pass("llm", "run-p")
    metrics.count_pass("llm", "run-q")
    assert metrics.REGISTRY.get_sample_value("datagen_run_passes_total", labels) == 2.0
    metrics.forget_run("llm", "run-p")
    assert metrics.REGISTRY.get_sample_value("datagen_run_passes_total", labels) is None
    assert metrics.REGISTRY.get_sample_value("datagen_run_passes_total", {**labels, "name": "run-q"}) == 1.0
