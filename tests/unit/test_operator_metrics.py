"""The operator's Prometheus metrics mirror a run's status and forget deleted runs."""

from __future__ import annotations

from prometheus_client import generate_latest

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
