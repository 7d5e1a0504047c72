"""Verdicts name the cause and the fix: evaluate(), the canary's judgement and the server-truth check."""

from __future__ import annotations

import orjson
import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import STATES, ShardProgress
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.canary import CanaryRecord, judge_canary
from datagen_operator.checks.evaluate import CheckContext, Tally, evaluate
from datagen_operator.checks.server_truth import probe_budgets, verify_parsers
from datagen_operator.control.progress import counters_from_snapshots
from tests.manifests import kimi_run, with_changes

CTX = CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, ChecksSpec())
KIMI = resolve_model(parse_run(kimi_run()).spec)


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


def record(flags, output=(1, 163607, 2, 163586), tools=False) -> CanaryRecord:
    return CanaryRecord("p", [163606], list(output), {"type": "stop"}, len(output), tools, frozenset(flags))


def test_canary_passes_clean_records_and_forgives_capped_truncation() -> None:
    outcome = judge_canary([record(()), record((rc.TRUNCATED,), output=(1, 2))], CTX, capped=True)
    assert outcome.passed, outcome.message


def test_canary_fails_on_any_raw_token_problem() -> None:
    outcome = judge_canary([record(()), record((rc.TOKEN_COUNT_MISMATCH,))], CTX, capped=True)
    assert not outcome.passed and "completion_tokens" in outcome.message


def test_canary_that_never_sees_a_think_end_is_inconclusive() -> None:
    outcome = judge_canary([record((rc.TRUNCATED,), output=(1, 2, 3))] * 3, CTX, capped=True)
    assert not outcome.passed and "raise generation.sampling.max_new_tokens" in outcome.message


def test_canary_verdict_survives_the_termination_message() -> None:
    outcome = judge_canary(
        [record((rc.NO_THINK_END, rc.PROMPT_CLOSES_THINK), output=(5, 163586))] * 8, CTX, capped=False
    )
    data = outcome.for_storage()
    assert len(data) <= 4096
    back = StepOutcome.from_storage(data)
    assert (back.passed, back.reason, back.message) == (outcome.passed, outcome.reason, outcome.message)


def test_server_without_reasoning_parser() -> None:
    outcome = verify_parsers(
        {"reasoning_parser": None, "tool_call_parser": "kimi_k2", "version": "0.5.23"}, None, KIMI, "kimi-k2.5"
    )
    assert not outcome.passed
    assert "without --reasoning-parser" in outcome.message and "--reasoning-parser kimi_k2" in outcome.message


def test_server_with_the_old_kimi_parser() -> None:
    outcome = verify_parsers({"reasoning_parser": "kimi", "tool_call_parser": "kimi_k2"}, None, KIMI, "kimi-k2.5")
    assert (
        "the server's reasoning parser is `kimi` (◁think▷) but kimi-k2.5 writes <think>; use kimi_k2" in outcome.message
    )


def test_chat_probe_proves_the_split() -> None:
    info = {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2", "version": "0.5.23"}
    good = {"message": {"reasoning_content": "221 = 13 * 17", "content": "No."}, "finish_reason": "stop"}
    assert verify_parsers(info, good, KIMI, "kimi-k2.5").passed
    glued = {"message": {"reasoning_content": None, "content": "221 = 13 * 17</think>No."}, "finish_reason": "stop"}
    outcome = verify_parsers(info, glued, KIMI, "kimi-k2.5")
    assert not outcome.passed and "empty reasoning_content" in outcome.message and "</think>" in outcome.message


def test_a_cut_probe_reply_is_inconclusive_never_a_mismatch() -> None:
    info = {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2", "version": "0.5.23"}
    cut = {"message": {"reasoning_content": "221 = 13 * 17 so", "content": None}, "finish_reason": "length"}
    outcome = verify_parsers(info, cut, KIMI, "kimi-k2.5")
    assert outcome.passed and "cut at its max_tokens" in outcome.message


def test_a_model_problem_is_left_to_the_canary() -> None:
    """All-reasoning or no-reasoning replies with the right parser are the model's, not the parser's."""
    info = {"reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2", "version": "0.5.23"}
    never_closed = {"message": {"reasoning_content": "221 = 13 * 17. No.", "content": None}, "finish_reason": "stop"}
    no_reasoning = {"message": {"reasoning_content": None, "content": "No."}, "finish_reason": "stop"}
    assert "never closed its reasoning" in verify_parsers(info, never_closed, KIMI, "kimi-k2.5").message
    assert "holds no reasoning" in verify_parsers(info, no_reasoning, KIMI, "kimi-k2.5").message
    assert verify_parsers(info, never_closed, KIMI, "kimi-k2.5").passed


def test_parser_names_are_compared_as_sglang_resolves_them() -> None:
    qwen3 = resolve_model(parse_run(with_changes("spec.model.preset", "qwen3")).spec)
    assert qwen3.tool_call_parser == "qwen25"
    info = {"reasoning_parser": "qwen3", "tool_call_parser": "qwen", "version": "0.5.23"}
    assert verify_parsers(info, None, qwen3, "qwen3").passed
    info_wrong = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes", "version": "0.5.23"}
    assert not verify_parsers(info_wrong, None, qwen3, "qwen3").passed


def test_probe_budgets_retry_with_the_runs_budget() -> None:
    assert probe_budgets(16384) == (4096, 16384)
    assert probe_budgets(1024) == (1024,)


def test_explicit_kimi_parser_without_preset_is_caught_by_the_probe() -> None:
    document = with_changes("spec.model.preset", None)
    del document["spec"]["model"]["preset"]
    document["spec"]["server"].update(reasoningParser="kimi", toolCallParser="kimi_k2")
    resolved = resolve_model(parse_run(document).spec)
    info = {"reasoning_parser": "kimi", "tool_call_parser": "kimi_k2"}
    probe = {"message": {"reasoning_content": None, "content": "<think>221 = 13 * 17</think>No."}}
    outcome = verify_parsers(info, probe, resolved, "/models/kimi")
    assert not outcome.passed and "use kimi_k2" in outcome.message and "`kimi` (◁think▷)" in outcome.message


def snapshot(state: str, **fields: object) -> ShardProgress:
    """A worker's snapshot as the operator reads it back from its ConfigMap."""
    return ShardProgress.from_storage(orjson.dumps({"shard": 0, "shard_count": 1, "state": state, **fields}))


def test_counters_from_worker_snapshots() -> None:
    running = ShardProgress(0, 2, "running", prompts_total=10, prompts_done=4, records_rejected=1, tokens_per_s=100.0)
    for has_tools in (True, True, False, False):
        running.counts.add(10, 100, 0, (rc.TRUNCATED,) if has_tools else (), has_tools)  # as the worker counts
    snapshots = [
        ShardProgress.from_storage(running.for_storage()),
        snapshot("complete", prompts_total=5, prompts_done=5, records_done=5, output_tokens=500, tokens_per_s=999.0,
                 flags={rc.TRUNCATED: 1}),
    ]  # fmt: skip
    counters = counters_from_snapshots(snapshots)
    assert (counters.prompts_total, counters.prompts_done, counters.completion_tokens) == (15, 9, 900)
    assert counters.tokens_per_second == 100.0  # finished shards no longer produce
    assert counters.tally == Tally(records=9, tool_records=2, rejected=1, flags={rc.TRUNCATED: 3}, lines=15)


@pytest.mark.parametrize("state", ["complete", "incomplete", "drained", "failed"])
def test_a_worker_that_exited_adds_no_rate(state: str) -> None:
    assert state in STATES
    snapshots = [snapshot("running", tokens_per_s=50.0), snapshot(state, tokens_per_s=999.0)]
    assert counters_from_snapshots(snapshots).tokens_per_second == 50.0


def test_set_aside_prompts_of_every_cause_are_counted() -> None:
    snapshots = [
        snapshot("running", prompts_malformed=1, set_aside={"bad_json": 1, "too_long": 2, "unrenderable": 1}),
        snapshot("running", prompts_malformed=3),  # a worker from before set_aside was published
    ]
    assert counters_from_snapshots(snapshots).malformed == 4 + 3


def test_thinking_control_reads_the_median_length_ratio() -> None:
    from datagen_operator.checks.canary import ThinkingControl, judge_thinking_control

    answers_only = ThinkingControl((0.8, 1.1, 1.3, 9.0))  # one unusually long answer decides nothing
    assert "ignores thinking" in judge_thinking_control(answers_only, CTX, "kimi-k2.5").verdict
    reasoning = ThinkingControl((6.5, 8.0, 0.9, 7.2))
    verdict = judge_thinking_control(reasoning, CTX, "kimi-k2.5").verdict
    assert "reasons but never closes its reasoning" in verdict and "x6.8" in verdict  # median of 6.5 and 7.2
