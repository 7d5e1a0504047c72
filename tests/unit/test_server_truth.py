"""checks.server_truth: the server's own word on its parsers, and the chat probe that proves the split."""

from __future__ import annotations

from datagen_operator.api import parse_run
from datagen_operator.api.resolve import resolve_model
from datagen_operator.checks.server_truth import probe_budgets, verify_parsers
from tests.manifests import kimi_run, with_changes

KIMI = resolve_model(parse_run(kimi_run()).spec)


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
