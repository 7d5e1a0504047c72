"""checks.evaluate: counted record flags to named checks with a rate, a threshold and a verdict."""

from __future__ import annotations

from dataclasses import replace

from datagen_operator.api.flags import (
    ABORTED,
    NO_THINK_END,
    NO_THINK_START,
    PROMPT_CLOSES_THINK,
    PROMPT_SUFFIX_LEAK,
    TOKEN_COUNT_MISMATCH,
    TRUNCATED,
    UNBALANCED_TOOL_CALLS,
    UNEXPECTED_REASONING,
)
from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks.evaluate import CheckContext, MarkersSeen, evaluate
from datagen_operator.presets.think_markers import MarkersWritten, ThinkMarkers

THINK = ThinkMarkers("<think>", "</think>")

CTX = CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, ChecksSpec())


def by_name(results):
    return {r.name: r for r in results}


def test_clean_tally_passes_everything() -> None:
    results = evaluate(Counts(records=100, tool_records=10), CTX)
    assert all(r.passed for r in results), [r.verdict for r in results if not r.passed]


def test_thinking_off_render_verdict_names_the_fix() -> None:
    counts = Counts(records=8, flags={NO_THINK_END: 8, PROMPT_CLOSES_THINK: 8})
    reasoning = by_name(evaluate(counts, CTX))["reasoning_captured"]
    assert not reasoning.passed
    assert reasoning.verdict.startswith("no `</think>` (163607) in 8/8 outputs")
    assert "the prompts end with `<think></think>`" in reasoning.verdict
    assert "set generation.thinking: true" in reasoning.verdict


def test_reasoning_rate_threshold() -> None:
    # 98% minimum over 100 records: 95/100 may be a 98% model's noise (checks.rates); 94/100 is clearly below it.
    ok = by_name(evaluate(Counts(records=100, flags={NO_THINK_END: 5}), CTX))["reasoning_captured"]
    bad = by_name(evaluate(Counts(records=100, flags={NO_THINK_END: 6}), CTX))["reasoning_captured"]
    assert ok.passed and not bad.passed and bad.rate == 0.94
    assert "consistent with the 98% minimum" in ok.verdict and "below the 98% minimum" in bad.verdict


def test_prompt_suffix_leak_verdict() -> None:
    counts = Counts(records=10, flags={TOKEN_COUNT_MISMATCH: 10, PROMPT_SUFFIX_LEAK: 10})
    result = by_name(evaluate(counts, CTX))["token_counts"]
    assert not result.passed and "prompt-suffix" in result.verdict and "10896" in result.verdict


def test_truncation_and_errors_and_tools() -> None:
    results = by_name(
        evaluate(Counts(records=100, tool_records=4, refused=5, flags={TRUNCATED: 6, UNBALANCED_TOOL_CALLS: 1}), CTX)
    )
    assert not results["truncation"].passed and "max_new_tokens" in results["truncation"].verdict
    assert not results["server_errors"].passed and "rejects.jsonl" in results["server_errors"].verdict
    assert not results["tool_calls"].passed


def test_tally_arithmetic() -> None:
    a = Counts(records=3, flags={TRUNCATED: 1})
    b = Counts(records=2, refused=1, flags={TRUNCATED: 1, ABORTED: 1})
    assert (a + b).records == 5 and (a + b).flags == {TRUNCATED: 2, ABORTED: 1}
    assert ((a + b) - a) == Counts(records=2, refused=1, flags={TRUNCATED: 1, ABORTED: 1})


# -- another family's think markers in the outputs ---------------------------------------------------------------
OLD_KIMI = ThinkMarkers("◁think▷", "◁/think▷")
QWEN3 = CheckContext(True, "qwen3", "<think>", "</think>", 151668, ChecksSpec())


def test_other_markers_are_named_instead_of_does_not_think() -> None:
    seen = MarkersSeen(MarkersWritten(OLD_KIMI, opener_written=True), outputs=7, families=("qwen3",))
    counts = Counts(records=7, flags={NO_THINK_START: 7})
    reasoning = by_name(evaluate(counts, replace(QWEN3, markers_seen=seen)))["reasoning_captured"]
    assert not reasoning.passed and reasoning.count == 7
    assert reasoning.verdict.startswith(
        "7/7 outputs write `◁think▷`…`◁/think▷`, not qwen3's `<think>`…`</think>` (151668): the model at "
        "model.path is not a qwen3 model, or qwen3 is the wrong preset for it"
    ), reasoning.verdict
    assert "does not think" not in reasoning.verdict and "never closed" not in reasoning.verdict
    assert "server.reasoningParser: kimi" in reasoning.verdict  # no preset writes ◁think▷: SGLang's `kimi` reads it


def test_a_closer_alone_is_named_when_the_template_opened_the_reasoning() -> None:
    seen = MarkersSeen(MarkersWritten(OLD_KIMI, opener_written=False), outputs=7, families=("kimi-k2",))
    counts = Counts(records=7, flags={NO_THINK_END: 7})
    reasoning = by_name(evaluate(counts, replace(CTX, markers_seen=seen)))["reasoning_captured"]
    assert reasoning.verdict.startswith("7/7 outputs write `◁/think▷`, not kimi-k2.5's `<think>`…`</think>` (163607)")


def test_markers_of_a_preset_name_that_preset() -> None:
    """A gpt-oss run whose model writes `<think>` itself, on a Qwen3 vocabulary: the Qwen3 hybrid is the model."""
    gpt_oss = CheckContext(True, "gpt-oss", "<|channel|>analysis<|message|>", "<|end|>", 200007, ChecksSpec())
    seen = MarkersSeen(MarkersWritten(THINK, True), outputs=3, families=("qwen3", "qwen3-thinking-2507"))
    counts = Counts(records=3, flags={NO_THINK_START: 3})
    verdict = by_name(evaluate(counts, replace(gpt_oss, markers_seen=seen)))["reasoning_captured"].verdict
    assert "not gpt-oss's `<|channel|>analysis<|message|>`…`<|end|>` (200007)" in verdict
    assert "they are preset qwen3's (reasoning parser qwen3): point model.path at a gpt-oss model, or set " in verdict
    assert "model.preset: qwen3" in verdict


def test_candidates_are_named_when_the_vocabulary_does_not_tell() -> None:
    gpt_oss = CheckContext(True, "gpt-oss", "<|channel|>analysis<|message|>", "<|end|>", 200007, ChecksSpec())
    seen = MarkersSeen(MarkersWritten(THINK, True), outputs=3, families=())
    verdict = by_name(evaluate(Counts(records=3, flags={NO_THINK_START: 3}), replace(gpt_oss, markers_seen=seen)))
    assert "presets kimi-k2-thinking, qwen3, glm-4.5 write them" in verdict["reasoning_captured"].verdict


def test_think_markers_where_the_preset_has_none_fail() -> None:
    instruct = CheckContext(False, "kimi-k2-instruct", None, None, None, ChecksSpec())
    assert by_name(evaluate(Counts(records=3), instruct))["reasoning_captured"].passed
    seen = MarkersSeen(MarkersWritten(THINK, True), outputs=2, families=("kimi-k2", "kimi-k2-thinking"))
    reasoning = by_name(evaluate(Counts(records=3), replace(instruct, markers_seen=seen)))["reasoning_captured"]
    assert not reasoning.passed and reasoning.count == 2
    assert reasoning.verdict.startswith(
        "2/3 outputs write `<think>`…`</think>` although kimi-k2-instruct does not reason: the model at model.path "
        "is not a kimi-k2-instruct model"
    ), reasoning.verdict
    assert "set model.preset: kimi-k2-thinking" in reasoning.verdict


def test_other_markers_with_thinking_off_fail() -> None:
    off = replace(QWEN3, thinking=False)
    seen = MarkersSeen(MarkersWritten(OLD_KIMI, True), outputs=1, families=("qwen3",))
    reasoning = by_name(evaluate(Counts(records=4), replace(off, markers_seen=seen)))["reasoning_captured"]
    assert not reasoning.passed and reasoning.verdict.startswith("1/4 outputs write `◁think▷`…`◁/think▷`, not qwen3's")


def test_other_markers_where_the_runs_own_are_no_token_fail() -> None:
    """No preset and `kimi` on a Qwen3 model: `◁/think▷` is no token of the vocabulary, so no flag can judge the
    outputs; the `<think>` ids they hold name the parser."""
    kimi = CheckContext(True, None, "◁think▷", "◁/think▷", None, ChecksSpec())
    assert by_name(evaluate(Counts(records=7), kimi))["reasoning_captured"].passed
    seen = MarkersSeen(MarkersWritten(THINK, True), outputs=7, families=("qwen3", "qwen3-thinking-2507"))
    reasoning = by_name(evaluate(Counts(records=7), replace(kimi, markers_seen=seen)))["reasoning_captured"]
    assert not reasoning.passed
    assert reasoning.verdict == (
        "7/7 outputs write `<think>`…`</think>`, not the run's `◁think▷`…`◁/think▷`: the model at model.path writes "
        "other markers than server.reasoningParser reads; use qwen3 (or set model.preset: qwen3)"
    )


def test_each_record_is_judged_by_its_lines_own_thinking() -> None:
    """A thinking run where lines that turn thinking off (chat_template_kwargs) reasoned anyway: their records
    are flagged unexpected_reasoning (judged off, Expectations.for_line), and that fails reasoning_captured;
    likewise a thinking-off run whose thinking-on lines did not reason."""
    on_run = by_name(evaluate(Counts(records=100, flags={UNEXPECTED_REASONING: 10}), CTX))["reasoning_captured"]
    assert not on_run.passed and on_run.count == 10
    assert "10/100 outputs of lines that turn thinking off themselves" in on_run.verdict
    off_ctx = replace(CTX, thinking=False)
    off_run = by_name(evaluate(Counts(records=100, flags={NO_THINK_END: 3}), off_ctx))["reasoning_captured"]
    assert not off_run.passed and off_run.count == 3
    assert "3/100 outputs of lines that turn thinking on themselves" in off_run.verdict
