"""A model that takes minutes to load: `datagen run`'s log says how far the load is at least every
LOADING_REPORT_S, not only the first second of it (its events show transitions only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from datagen_operator.control import server
from datagen_operator.control.server import LOADING_REPORT_S, loading_line_due
from datagen_operator.local.main import main as datagen_run
from tests.local.runs import FAST_SIM, manifest


def test_the_loading_message_is_due_again_within_a_minute() -> None:
    assert LOADING_REPORT_S <= 60
    assert loading_line_due("Loading", None, 5.0)
    assert not loading_line_due("Loading", 100.0, 100.0 + LOADING_REPORT_S - 1)
    assert loading_line_due("Loading", 100.0, 100.0 + LOADING_REPORT_S)
    assert not loading_line_due("Ready", 100.0, 100.0 + 10 * LOADING_REPORT_S)


def test_run_log_repeats_the_loading_time_while_the_model_loads(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seconds stand for the half minutes of a real load: the simulator's /health answers 503 for 4 s.
    monkeypatch.setattr(server, "LOADING_REPORT_S", 1.0)
    run_file = manifest(tmp_path, standin)
    code = datagen_run([str(run_file), "--simulator", "--sim-arg=--sim-load-seconds=4", *FAST_SIM])
    out = capsys.readouterr().out
    assert code == 0, out
    said = [int(seconds) for seconds in re.findall(r"ServerReady=False \(Loading\): loading the model: (\d+)s of", out)]
    assert len(said) >= 3, out
    assert said == sorted(said) and said[-1] >= said[0] + 2, said  # the time moves, once per report
