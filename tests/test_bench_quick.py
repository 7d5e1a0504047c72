"""Every benchmark in bench/ runs in its quick mode, so a change that breaks one (a new store column, a renamed
function) fails `make test` instead of the next person who runs `make bench`.

The benchmarks are found by globbing bench/*.py: a new one is covered the day it lands. Each needs a `--quick`
mode (small sizes, seconds) whose last line is its figures, `name=value ...`. The figures are not judged here
(timing never decides a test): exiting 0 and printing them is what passes. A benchmark that starts the real
control plane (it imports tests.harness.testbin for the binaries) is a `cluster` test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted((REPO / "bench").glob("*.py"))
CONTROL_PLANE_IMPORT = "tests.harness.testbin"
FIGURES = re.compile(r"^[A-Za-z_][\w.]*=\S+")
TIMEOUT_S = 300  # a quick mode takes seconds; the control plane's start-up and a cold wheel download take longer


def needs_control_plane(bench: Path) -> bool:
    return CONTROL_PLANE_IMPORT in bench.read_text()


MODES = {"operator": ("--generating",)}
"""Benchmarks with a second mode whose quick run is held too (each a parameter of its own)."""


def run_quick(bench: Path, *mode: str) -> tuple[int, str, str]:
    """`python bench/NAME.py --quick` in its own process group, so a timeout also ends the simulators and
    workers it started."""
    process = subprocess.Popen(
        [sys.executable, str(bench), "--quick", *mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"},
    )
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(
            f"{bench.name} --quick ran over {TIMEOUT_S} s (a quick mode takes seconds)\n{out[-2000:]}\n{err[-3000:]}"
        )
    return process.returncode, out, err


def test_every_benchmark_is_found() -> None:
    assert len(BENCHES) >= 8, [bench.name for bench in BENCHES]
    assert needs_control_plane(REPO / "bench" / "operator.py")
    assert not needs_control_plane(REPO / "bench" / "export.py")


@pytest.mark.parametrize(
    ("bench", "mode"),
    [
        pytest.param(
            bench,
            mode,
            id=" ".join([bench.stem, *mode]),
            marks=[pytest.mark.cluster] if needs_control_plane(bench) else [],
        )
        for bench in BENCHES
        for mode in [(), *([MODES[bench.stem]] if bench.stem in MODES else [])]
    ],
)
def test_quick_mode_runs_and_prints_its_figures(bench: Path, mode: tuple[str, ...]) -> None:
    code, out, err = run_quick(bench, *mode)
    if code == 2 and "unrecognized arguments: --quick" in err:
        pytest.fail(f"bench/{bench.name} has no --quick mode: add one (small sizes, seconds, figures not judged)")
    assert code == 0, f"bench/{bench.name} --quick exited {code}\n{out[-2000:]}\n{err[-4000:]}"
    lines = out.strip().splitlines()
    assert lines and FIGURES.match(lines[-1]), (
        f"bench/{bench.name} --quick: the last line should be its figures (name=value ...), got {lines[-1:]}"
    )
