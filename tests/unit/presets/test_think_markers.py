"""presets.think_markers: the reasoning parser named from the markers a model wrote and its family, never the
first parser whose tags match."""

from __future__ import annotations

import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.resolve import resolve_model
from datagen_operator.presets import Preset, presets
from datagen_operator.presets.sglang_names import REASONING_PARSER_TAGS
from datagen_operator.presets.think_markers import (
    MarkersWritten,
    ThinkMarkers,
    fix_for,
    known_markers,
    markers_read_by,
    parsers_reading,
    preset_markers,
    tool_parser_families,
    written_in,
)
from tests.manifests import DELETE, example_run

THINK = ThinkMarkers("<think>", "</think>")
OLD_KIMI = ThinkMarkers("◁think▷", "◁/think▷")
HARMONY = ThinkMarkers("<|channel|>analysis<|message|>", "<|end|>")
REASONING_PRESETS = [preset for preset in presets().values() if preset_markers(preset) is not None]
FAMILIES = sorted({preset.family for preset in presets().values()})


def as_written(preset: Preset) -> MarkersWritten:
    """What the preset's model writes: the opener too, unless its template prefills it."""
    markers = preset_markers(preset)
    assert markers is not None
    return MarkersWritten(markers, opener_written=not preset.thinking.prompt_prefills_opener)


def test_every_preset_parser_reads_its_presets_markers() -> None:
    for preset in REASONING_PRESETS:
        assert markers_read_by(preset.reasoning_parser) == preset_markers(preset), preset.name
        assert preset.reasoning_parser in parsers_reading(preset_markers(preset)), preset.name  # type: ignore[arg-type]


def test_known_markers_hold_every_parsers_and_every_presets() -> None:
    known = set(known_markers())
    assert {ThinkMarkers(*tags) for tags in REASONING_PARSER_TAGS.values()} <= known
    assert {preset_markers(p) for p in REASONING_PRESETS} <= known
    assert {THINK, OLD_KIMI, HARMONY} <= known


@pytest.mark.parametrize("preset", REASONING_PRESETS, ids=lambda p: p.name)
def test_the_family_names_the_parser_of_its_markers(preset: Preset) -> None:
    fix = fix_for(as_written(preset), families=(preset.family,))
    assert fix.parser == preset.reasoning_parser, fix
    assert preset.name in fix.presets


@pytest.mark.parametrize("preset", REASONING_PRESETS, ids=lambda p: p.name)
def test_the_tool_call_parser_tells_the_family_when_there_is_no_preset(preset: Preset) -> None:
    """Without a preset the run's tool-call parser is the family evidence; Qwen3 hybrid and Qwen3-2507 share
    qwen25 and are told apart by whether the model wrote the opener (the 2507 template prefills it)."""
    families = tool_parser_families(preset.tool_call_parser)
    assert preset.family in families
    assert fix_for(as_written(preset), families=families).parser == preset.reasoning_parser


def test_tool_call_parser_names_are_compared_as_sglang_resolves_them() -> None:
    assert tool_parser_families("qwen") == tool_parser_families("qwen25") == ("qwen3", "qwen3-thinking-2507")
    assert tool_parser_families("hermes") == tool_parser_families(None) == ()


@pytest.mark.parametrize("family", [*FAMILIES, None])
def test_old_kimi_markers_name_kimi_whatever_the_family(family: str | None) -> None:
    for opener in (True, False):
        fix = fix_for(MarkersWritten(OLD_KIMI, opener), families=(family,) if family else ())
        assert (fix.parser, fix.presets) == ("kimi", ()), fix


def test_harmony_names_gpt_oss() -> None:
    assert fix_for(MarkersWritten(HARMONY, True)).parser == "gpt-oss"
    assert fix_for(MarkersWritten(HARMONY, True), families=("qwen3",)).parser == "gpt-oss"


def test_ambiguous_markers_and_no_family_give_the_candidates_not_a_guess() -> None:
    opened = fix_for(MarkersWritten(THINK, opener_written=True))
    assert opened.parser is None
    assert opened.parsers == ("kimi_k2", "qwen3", "glm45")
    assert opened.presets == ("kimi-k2-thinking", "qwen3", "glm-4.5")
    prefilled = fix_for(MarkersWritten(THINK, opener_written=False))
    assert prefilled.parser is None
    assert prefilled.parsers == ("kimi_k2", "qwen3-thinking", "deepseek-r1")
    assert fix_for(MarkersWritten(THINK, opener_written=None)).parser is None


def test_never_the_first_parser_whose_tags_match() -> None:
    """kimi_k2 is listed first among the `<think>` parsers; a Qwen3 or DeepSeek-R1 model is not named by it."""
    assert next(iter(REASONING_PARSER_TAGS)) == "kimi_k2"
    assert fix_for(MarkersWritten(THINK, True), families=("qwen3",)).parser == "qwen3"
    assert fix_for(MarkersWritten(THINK, False), families=("deepseek-r1",)).parser == "deepseek-r1"


def test_family_evidence_the_markers_contradict_is_left_out() -> None:
    """A gpt-oss tokenizer with `<think>` outputs: the markers are what the model wrote, the family cannot pick."""
    fix = fix_for(MarkersWritten(THINK, True), families=("gpt-oss",))
    assert fix.parsers == ("kimi_k2", "qwen3", "glm45")


def test_markers_written_in_text_are_the_earliest_found() -> None:
    assert written_in("no tags here") is None
    assert written_in("<think>a</think>b") == MarkersWritten(THINK, True)
    assert written_in("a</think>b") == MarkersWritten(THINK, False)
    assert written_in("◁think▷a◁/think▷b") == MarkersWritten(OLD_KIMI, True)
    assert written_in("a◁/think▷ then </think>") == MarkersWritten(OLD_KIMI, False)
    assert written_in("<|channel|>analysis<|message|>a<|end|><|start|>") == MarkersWritten(HARMONY, True)


def test_a_run_without_preset_expects_the_markers_its_parser_reads() -> None:
    """gpt-oss is in the tag table, so a run that names it without a preset expects harmony, not `<think>`."""
    changes = {
        "spec.model.preset": DELETE,
        "spec.server.reasoningParser": "gpt-oss",
        "spec.server.toolCallParser": "gpt-oss",
    }
    resolved = resolve_model(parse_run(example_run(**changes)).spec)
    assert ThinkMarkers(resolved.think_start, resolved.think_end) == HARMONY  # type: ignore[arg-type]
