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
    tmp_path: Path, standin_tokenizer: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seconds stand for the half minutes of a real load: the simulator's /health answers 503 for 4 s.
    monkeypatch.setattr(server, "LOADING_REPORT_S", 1.0)
    run_file = manifest(tmp_path, standin_tokenizer)
    code = datagen_run([str(run_file), "--simulator", "--sim-arg=--sim-load-seconds=4", *FAST_SIM])
    out = capsys.readouterr().out
    assert code == 0, out
    said = [int(seconds) for seconds in re.findall(r"ServerReady=False \(Loading\): loading the model: (\d+)s of", out)]
    assert len(said) >= 3, out
    assert said == sorted(said) and said[-1] >= said[0] + 2, said  # the time moves, once per report


def test_run_log_repeats_progress_while_the_workers_generate(
    tmp_path: Path, standin_tokenizer: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a terminal the events are the display: Progressing's done/total and tok/s are said again as they
    move, not only `0/N` at the start and the total at the end."""
    from datagen_operator.local import display

    monkeypatch.setattr(display, "PROGRESS_REPORT_S", 0.5)
    run_file = manifest(tmp_path, standin_tokenizer)
    paced = ["--sim-arg=--sim-speed=gpu", "--sim-arg=--sim-tokens-per-s=40", "--sim-arg=--sim-ttft-s=0.05", *FAST_SIM]
    code = datagen_run([str(run_file), "--simulator", *paced])
    out = capsys.readouterr().out
    assert code == 0, out
    said = re.findall(r"Progressing=True \(Running\): (\d+)/(\d+) prompts(, [\d.]+k? tok/s)?", out)
    done = [int(d) for d, _, _ in said]
    assert len(said) >= 3 and done == sorted(done) and len(set(done)) >= 3, out
    assert any(rate for _, _, rate in said[1:]), "a repeated line says the rate"
    assert re.search(r"Progressing=True \(Running\): \d+/24 prompts, [\d.]+k? tok/s, ETA \d+s", out), out


def test_the_eta_is_read_from_the_rate_records_are_done_here() -> None:
    from datagen_operator.local.display import eta_words

    assert eta_words((10.0, 100), (20.0, 300), 1300) == ", ETA 50s"  # 200 records in 10 s, 1000 left
    assert eta_words((10.0, 100), (20.0, 100), 1300) == ""  # no rate yet
    assert eta_words((10.0, 100), (20.0, 1300), 1300) == ""  # done
