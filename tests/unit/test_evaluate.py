"""checks.evaluate: counted record flags to named checks with a rate, a threshold and a verdict."""

from __future__ import annotations

from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import CheckContext, Tally, evaluate

CTX = CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, ChecksSpec())


def by_name(results):
    return {r.name: r for r in results}


def test_clean_tally_passes_everything() -> None:
    results = evaluate(Tally(records=100, tool_records=10), CTX)
    assert all(r.passed for r in results), [r.verdict for r in results if not r.passed]


def test_thinking_off_render_verdict_names_the_fix() -> None:
    tally = Tally(records=8, flags={rc.NO_THINK_END: 8, rc.PROMPT_CLOSES_THINK: 8})
    reasoning = by_name(evaluate(tally, CTX))["reasoning_captured"]
    assert not reasoning.passed
    assert reasoning.verdict.startswith("no `</think>` (163607) in 8/8 outputs")
    assert "the prompts end with `<think></think>`" in reasoning.verdict
    assert "set generation.thinking: true" in reasoning.verdict


def test_reasoning_rate_threshold() -> None:
    ok = by_name(evaluate(Tally(records=100, flags={rc.NO_THINK_END: 2}), CTX))["reasoning_captured"]
    bad = by_name(evaluate(Tally(records=100, flags={rc.NO_THINK_END: 3}), CTX))["reasoning_captured"]
    assert ok.passed and not bad.passed and bad.rate == 0.97


def test_prompt_suffix_leak_verdict() -> None:
    tally = Tally(records=10, flags={rc.TOKEN_COUNT_MISMATCH: 10, rc.PROMPT_SUFFIX_LEAK: 10})
    result = by_name(evaluate(tally, CTX))["token_counts"]
    assert not result.passed and "prompt-suffix" in result.verdict and "10896" in result.verdict


def test_truncation_and_errors_and_tools() -> None:
    results = by_name(
        evaluate(
            Tally(records=100, tool_records=4, rejected=5, flags={rc.TRUNCATED: 3, rc.UNBALANCED_TOOL_CALLS: 1}), CTX
        )
    )
    assert not results["truncation"].passed and "max_new_tokens" in results["truncation"].verdict
    assert not results["server_errors"].passed and "rejects.jsonl" in results["server_errors"].verdict
    assert not results["tool_calls"].passed


def test_tally_arithmetic() -> None:
    a = Tally(records=3, flags={rc.TRUNCATED: 1})
    b = Tally(records=2, rejected=1, flags={rc.TRUNCATED: 1, rc.ABORTED: 1})
    assert (a + b).records == 5 and (a + b).flags == {rc.TRUNCATED: 2, rc.ABORTED: 1}
    assert ((a + b) - a) == Tally(records=2, rejected=1, flags={rc.TRUNCATED: 1, rc.ABORTED: 1})
