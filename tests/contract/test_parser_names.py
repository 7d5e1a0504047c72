"""The parser names we emit exist in the pinned SGLang release, read from its own wheel.

The wheel comes from `tests/contract/wheel.py` (downloaded once into a cache outside the repo); the
name files are dependency-free modules loaded with importlib, without importing `sglang`.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from datagen_operator.presets import presets
from datagen_operator.presets.sglang_names import (
    PINNED_SGLANG_VERSION,
    REASONING_PARSER_NAMES,
    REASONING_PARSER_TAGS,
    TOOL_CALL_PARSER_NAMES,
)

NAME_FILES = {
    "reasoning": "sglang/srt/parser/reasoning_parser_names.py",
    "tools": "sglang/srt/function_call/parser_names.py",
}


def _load_names(wheel: Path, member: str, tmp: Path) -> ModuleType:
    with zipfile.ZipFile(wheel) as archive:
        target = tmp / Path(member).name
        target.write_bytes(archive.read(member))
    spec = importlib.util.spec_from_file_location(f"sglang_names_{target.stem}", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def wheel_names(sglang_wheel_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    tmp = tmp_path_factory.mktemp("sglang-names")
    return {
        "reasoning": _load_names(sglang_wheel_path, NAME_FILES["reasoning"], tmp).REASONING_PARSER_NAMES,
        "tools": _load_names(sglang_wheel_path, NAME_FILES["tools"], tmp).TOOL_CALL_PARSER_NAMES,
    }


def test_wheel_is_the_pinned_version(sglang_wheel_path: Path) -> None:
    assert sglang_wheel_path.name.startswith(f"sglang-{PINNED_SGLANG_VERSION}-")


def test_our_copy_of_the_names_matches_the_wheel(wheel_names: dict[str, list[str]]) -> None:
    assert sorted(REASONING_PARSER_NAMES) == sorted(wheel_names["reasoning"])
    assert sorted(TOOL_CALL_PARSER_NAMES) == sorted(wheel_names["tools"])


def test_every_preset_parser_exists_in_the_pinned_sglang(wheel_names: dict[str, list[str]]) -> None:
    for preset in presets().values():
        if preset.reasoning_parser is not None:
            assert preset.reasoning_parser in wheel_names["reasoning"], preset.name
        if preset.tool_call_parser is not None:
            assert preset.tool_call_parser in wheel_names["tools"], preset.name


def test_tag_table_names_exist(wheel_names: dict[str, list[str]]) -> None:
    assert set(REASONING_PARSER_TAGS) <= set(wheel_names["reasoning"])
