"""What `datagen` prints where a new user first looks: help into a pipe, the presets table at any width, help
texts, and refusals that name the field to fix."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from datagen_operator.presets import presets
from tests.manifests import local_run, write_run

ROOT = Path(__file__).resolve().parents[3]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def datagen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", *args], capture_output=True, text=True, env=env
    )


def into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """`datagen ARGS | head -0`, deterministically: the reader is gone before the first write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "datagen_operator.cli", *args], stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)


def in_terminal(columns: int, *args: str) -> str:
    """What `datagen ARGS` shows in a terminal `columns` wide (a pseudo-terminal; rich reads COLUMNS)."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "datagen_operator.cli", *args], stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert process.wait(timeout=60) == 0
    return ANSI.sub("", b"".join(chunks).decode())


@pytest.mark.parametrize("args", [["-h"], ["crd"], ["presets"]], ids=["help", "crd", "presets"])
def test_output_into_a_closed_pipe_ends_without_a_traceback(args: list[str]) -> None:
    result = into_closed_pipe(*args)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    # 141 as a shell reports a command SIGPIPE stopped; rich's console catches the error itself and exits 1.
    assert result.returncode in (1, 141)


def _names() -> set[str]:
    names = set(presets())
    for preset in presets().values():
        names |= {parser for parser in (preset.reasoning_parser, preset.tool_call_parser) if parser}
    return names


def _words(text: str) -> set[str]:
    return set(re.split(r"[\s│┃]+", text))


def test_presets_piped_shows_every_name_whole_on_one_row_each() -> None:
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = datagen("presets", env=env)
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert _names() <= _words(result.stdout)
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ ") and not line.startswith("│  ")]
    assert sorted(row.split("│")[1].strip() for row in rows) == sorted(presets())


@pytest.mark.parametrize("columns", [80, 60])
def test_presets_in_a_narrow_terminal_cuts_no_name(columns: int) -> None:
    shown = in_terminal(columns, "presets")
    assert "…" not in shown
    assert _names() <= _words(shown)
    assert max(len(line) for line in shown.splitlines()) <= columns


def test_top_level_help_says_standin_tokenizer_takes_a_preset() -> None:
    line = next(line for line in datagen("--help").stdout.splitlines() if line.strip().startswith("standin-tokenizer"))
    assert "--preset" in line and "Kimi-K2-format stand-in" not in line
    assert "--preset" in datagen("standin-tokenizer", "--help").stdout  # what the line promises exists


def test_every_simulator_option_has_help_text() -> None:
    from datagen_operator.engine.sim.config import build_parser

    undocumented = [
        action.option_strings[0]
        for action in build_parser()._actions
        if any(option.startswith("--sim-") for option in action.option_strings) and not action.help
    ]
    assert undocumented == []


def test_run_refuses_a_missing_dataset_naming_spec_dataset_path(tmp_path: Path) -> None:
    missing = tmp_path / "prompts" / "b1.jsonl"
    # The dataset is looked at first, so any existing model directory does here.
    manifest = write_run(tmp_path / "run.yaml", local_run(tmp_path, missing, tmp_path / "out"))
    result = datagen("run", "--simulator", str(manifest))
    assert result.returncode == 2
    said = " ".join(result.stdout.split())
    assert f"spec.dataset.path: {missing} does not exist on this machine" in said
    assert not (tmp_path / "out").exists()  # refused before any preflight, server or output


def test_sglang_refusal_keeps_the_extra_in_its_brackets() -> None:
    from datagen_operator.local.servers import real_sglang_available

    if real_sglang_available():
        pytest.skip("sglang and a GPU are here: --sglang is not refused")
    result = datagen("run", "--sglang", str(ROOT / "examples" / "quickstart.yaml"))
    assert result.returncode == 2
    assert "pip install -e '.[sglang]'" in " ".join(result.stdout.split())  # rich markup would eat [sglang]


def test_operator_docs_and_chart_agree_with_its_peering_option() -> None:
    from datagen_operator.k8s.main import build_parser

    options = {option for action in build_parser()._actions for option in action.option_strings}
    assert "--peering" in options
    for path in ("docs/install.md", "charts/datagen-operator/values.yaml", "docs/operator.md"):
        text = " ".join((ROOT / path).read_text().replace("#", " ").split())
        assert not re.search(r"no `?--peering`? option|NOT USABLE YET", text), path
    synopsis = (ROOT / "docs" / "operator.md").read_text().split("```")[1]
    assert {"--namespace", "--liveness", "--peering", "--verbose"} <= set(re.findall(r"--[a-z-]+", synopsis))
