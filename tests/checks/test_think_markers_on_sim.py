"""The gate against the simulator when the model's think markers are not the run's: the halt names the parser
of the model's family (not the first parser whose tags match), and the canary names the markers written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.presets import Preset, get_preset, presets
from datagen_operator.tokenizer.standin import ensure_standin
from tests.checks.test_gate_on_sim import REPO, SHORT, canary_outcome, parsers_outcome
from tests.harness.sim import start_sim
from tests.manifests import DELETE, local_spec

DATASET = REPO / "examples" / "prompts" / "quickstart.jsonl"
REASONING_PRESETS = [name for name, preset in presets().items() if preset.thinking.supported]


def spec_of(model_dir: Path, **changes: object) -> DataGenRunSpec:
    base = {"generation.sampling": {"max_new_tokens": 2048}, "checks.canaryPrompts": 4}
    return parse_spec(local_spec(model_dir, DATASET, Path("/unused"), **base, **changes))


def preset_flags(preset: Preset) -> list[str]:
    flags = ["--sim-family", preset.family]
    for flag, value in (
        ("--reasoning-parser", preset.reasoning_parser),
        ("--tool-call-parser", preset.tool_call_parser),
    ):
        flags += [flag, value] if value else []
    return flags


@pytest.mark.parametrize(("preset", "tools"), [("qwen3", "qwen25"), ("deepseek-r1", "deepseekv3")])
def test_old_kimi_parser_without_a_preset_names_the_models_own_parser(preset: str, tools: str) -> None:
    """No preset, `reasoningParser: kimi` on a Qwen3 or DeepSeek-R1 model: the probe's content holds `<think>`
    tags, which every `<think>` parser reads; the run's tool-call parser tells the family. The canary (for a
    run set to go on past the parsers) names the same parser from the outputs' ids and the vocabulary."""
    family = get_preset(preset).family
    model_dir = ensure_standin(preset)
    changes = {"model.preset": DELETE, "server": {"reasoningParser": "kimi", "toolCallParser": tools}}
    spec = spec_of(model_dir, **changes)
    flags = ("--sim-family", family, "--reasoning-parser", "kimi", "--tool-call-parser", tools)
    with start_sim(*flags, *SHORT, tokenizer_dir=model_dir) as sim:
        outcome = parsers_outcome(sim.url, spec)
        canary = canary_outcome(sim.url, spec, model_dir)
    assert not outcome.passed
    assert "the server's reasoning parser `kimi` (◁think▷) does not match" in outcome.message, outcome.message
    assert re.search(r"; use (\S+) \(", outcome.message).group(1) == preset, outcome.message  # type: ignore[union-attr]
    assert "kimi_k2" not in outcome.message
    assert not canary.passed
    assert "not the run's `◁think▷`…`◁/think▷`: the model at model.path writes other markers" in canary.message
    assert re.search(r"; use (\S+) \(", canary.message).group(1) == preset, canary.message  # type: ignore[union-attr]


@pytest.mark.parametrize("preset", REASONING_PRESETS)
def test_a_model_writing_old_kimi_markers_is_named_under_every_preset(preset: str) -> None:
    """The simulator's `kimi-tags` model writes `◁think▷`/`◁/think▷` as text in the family's vocabulary; a
    template that opens the reasoning leaves only `◁/think▷` in the outputs."""
    model_dir = ensure_standin(preset)
    spec = spec_of(model_dir, **{"model.preset": preset})
    with start_sim(
        *preset_flags(get_preset(preset)), *SHORT, "--sim-misconfig", "kimi-tags", tokenizer_dir=model_dir
    ) as sim:
        parsers = parsers_outcome(sim.url, spec)
        canary = canary_outcome(sim.url, spec, model_dir)
    written = "`◁/think▷`" if get_preset(preset).thinking.prompt_prefills_opener else "`◁think▷`…`◁/think▷`"
    assert not canary.passed
    assert re.match(rf"\d+/\d+ outputs write {re.escape(written)}, not {re.escape(preset)}'s ", canary.message), (
        canary.message
    )
    assert f"the model at model.path is not a {preset} model, or {preset} is the wrong preset" in canary.message
    assert "server.reasoningParser: kimi" in canary.message
    assert "does not think" not in canary.message and "never closes" not in canary.message
    assert "model_thinking" not in {check.name for check in canary.checks}, "no control requests were needed"
    if parsers.passed:  # the preset's parser takes all for reasoning: the probe notes it, the canary judges
        assert "`◁think▷`…`◁/think▷`" in parsers.message or "◁/think▷" in parsers.message, parsers.message
    else:  # gpt-oss's parser leaves them in content: the model, not the parser, is named
        assert f"not {preset}'s" in parsers.message and "use kimi" not in parsers.message, parsers.message
