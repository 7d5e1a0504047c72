"""presets/sglang_names.REASONING_PARSER_TAGS, which names the fix from the markers a model wrote
(presets/think_markers.py), held to the markers SGLang's own reasoning-parser detectors look for."""

from __future__ import annotations

from datagen_operator.presets.sglang_names import REASONING_PARSER_TAGS
from tests.contract import sglang_sim_side
from tests.contract.conftest import SGLang


def test_every_parsers_tags_are_the_ones_sglangs_detector_looks_for(sglang: SGLang) -> None:
    theirs = sglang.call(sglang_sim_side.reasoning_tags, sorted(REASONING_PARSER_TAGS))
    assert {name: tuple(tags) for name, tags in theirs.items()} == REASONING_PARSER_TAGS
