"""checks.server_truth: the server's own word on its parsers, and the chat probe that proves the split."""

from __future__ import annotations

import re

import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.checks.server_truth import probe_budgets, verify_parsers
from datagen_operator.presets import Preset, presets
from datagen_operator.presets.sglang_names import REASONING_PARSER_TAGS, resolved_tool_call_parser
from datagen_operator.presets.think_markers import ThinkMarkers, preset_markers
from tests.manifests import DELETE, example_run

KIMI = resolve_model(parse_run(example_run()).spec)


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
    qwen3 = resolve_model(parse_run(example_run(**{"spec.model.preset": "qwen3"})).spec)
    assert qwen3.tool_call_parser == "qwen25"
    info = {"reasoning_parser": "qwen3", "tool_call_parser": "qwen", "version": "0.5.23"}
    assert verify_parsers(info, None, qwen3, "qwen3").passed
    info_wrong = {"reasoning_parser": "qwen3", "tool_call_parser": "hermes", "version": "0.5.23"}
    assert not verify_parsers(info_wrong, None, qwen3, "qwen3").passed


def test_probe_budgets_retry_with_the_runs_budget() -> None:
    assert probe_budgets(16384) == (4096, 16384)
    assert probe_budgets(1024) == (1024,)


def test_explicit_kimi_parser_without_preset_is_caught_by_the_probe() -> None:
    document = example_run(
        **{"spec.model.preset": DELETE, "spec.server.reasoningParser": "kimi", "spec.server.toolCallParser": "kimi_k2"}
    )
    resolved = resolve_model(parse_run(document).spec)
    info = {"reasoning_parser": "kimi", "tool_call_parser": "kimi_k2"}
    probe = {"message": {"reasoning_content": None, "content": "<think>221 = 13 * 17</think>No."}}
    outcome = verify_parsers(info, probe, resolved, "/models/kimi")
    assert not outcome.passed and "use kimi_k2" in outcome.message and "`kimi` (◁think▷)" in outcome.message


# -- the fix named from the markers the model wrote and its family ---------------------------------------------
REASONING_PRESETS = [p for p in presets().values() if preset_markers(p) is not None]


def no_preset(reasoning: str, tools: str) -> ResolvedModel:
    """A run that names its parsers itself: the tool-call parser is then the only word on the model's family."""
    changes = {
        "spec.model.preset": DELETE,
        "spec.server.reasoningParser": reasoning,
        "spec.server.toolCallParser": tools,
    }
    return resolve_model(parse_run(example_run(**changes)).spec)


def reply_of(preset: Preset) -> str:
    """What the preset's model writes to the probe, as content when the server's parser finds nothing."""
    markers = preset_markers(preset)
    assert markers is not None
    if preset.reasoning_format == "harmony":
        return f"{markers.start}221 = 13 * 17{markers.end}<|start|>assistant<|channel|>final<|message|>No."
    opener = "" if preset.thinking.prompt_prefills_opener else markers.start
    return f"{opener}221 = 13 * 17{markers.end}No."


def named_fix(message: str) -> str | None:
    found = re.search(r"; use (\S+) \(", message)
    return found.group(1) if found else None


@pytest.mark.parametrize(
    ("preset", "wrong"),
    [
        (preset, wrong)
        for preset in REASONING_PRESETS
        for wrong, tags in REASONING_PARSER_TAGS.items()
        if ThinkMarkers(*tags) != preset_markers(preset)
    ],
    ids=lambda value: value.name if isinstance(value, Preset) else value,
)
def test_the_fix_is_the_parser_of_the_models_family(preset: Preset, wrong: str) -> None:
    """Every family under every parser that looks for other markers: the fix is the family's own parser (its
    tool-call parser tells the family), never the first parser whose tags the content holds."""
    assert preset.tool_call_parser is not None
    resolved = no_preset(wrong, preset.tool_call_parser)
    info = {"reasoning_parser": wrong, "tool_call_parser": resolved_tool_call_parser(preset.tool_call_parser)}
    probe = {"message": {"reasoning_content": None, "content": reply_of(preset)}, "finish_reason": "stop"}
    outcome = verify_parsers(info, probe, resolved, "/models/x")
    assert not outcome.passed
    assert named_fix(outcome.message) == preset.reasoning_parser, outcome.message


def test_without_the_family_the_candidates_are_named_not_a_guess() -> None:
    resolved = no_preset("kimi", "hermes")  # hermes is no preset's: the family is unknown
    info = {"reasoning_parser": "kimi", "tool_call_parser": "hermes"}
    probe = {"message": {"reasoning_content": None, "content": "<think>221 = 13 * 17</think>No."}}
    outcome = verify_parsers(info, probe, resolved, "/models/x")
    assert not outcome.passed and named_fix(outcome.message) is None, outcome.message
    assert "one of kimi_k2 (preset kimi-k2-thinking), qwen3 (preset qwen3), glm45 (preset glm-4.5)" in outcome.message


def test_a_preset_whose_model_writes_other_markers_names_the_model_not_a_parser() -> None:
    """gpt-oss's parser is right for the preset: a model that writes ◁think▷ is the wrong model (or preset)."""
    gpt_oss = resolve_model(parse_run(example_run(**{"spec.model.preset": "gpt-oss"})).spec)
    info = {"reasoning_parser": "gpt-oss", "tool_call_parser": "gpt-oss"}
    probe = {"message": {"reasoning_content": None, "content": "◁think▷221 = 13 * 17◁/think▷No."}}
    outcome = verify_parsers(info, probe, gpt_oss, "gpt-oss")
    assert not outcome.passed and named_fix(outcome.message) is None, outcome.message
    assert "writes `◁think▷`…`◁/think▷`, not gpt-oss's `<|channel|>analysis<|message|>`…`<|end|>`" in outcome.message
    assert "model.path is not a gpt-oss model, or gpt-oss is the wrong preset for it" in outcome.message


def test_other_markers_inside_the_reasoning_are_noted_for_the_canary() -> None:
    qwen3 = resolve_model(parse_run(example_run(**{"spec.model.preset": "qwen3"})).spec)
    info = {"reasoning_parser": "qwen3", "tool_call_parser": "qwen", "version": "0.5.23"}
    probe = {"message": {"reasoning_content": "◁think▷221 = 13 * 17◁/think▷No.", "content": ""}}
    outcome = verify_parsers(info, probe, qwen3, "qwen3")
    assert outcome.passed
    assert "`◁think▷`…`◁/think▷`, not qwen3's `<think>`…`</think>` (the canary judges the model)" in outcome.message
