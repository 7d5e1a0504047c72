"""The data of `datagen verify --html`'s plots (checks/report_data.py), from numbers whose plots are known."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from datagen_operator.api.status import CheckResult
from datagen_operator.checks.report_data import (
    MAX_BINS,
    checks_plot,
    finish_plot,
    length_plot,
    throughput_plot,
)


def test_lengths_are_binned_per_turn_over_shared_whole_token_bins() -> None:
    values = np.arange(100, 1100, dtype=np.int64)  # 1000 lengths, 100..1099 tokens
    turns = np.arange(1000, dtype=np.int64) % 3
    plot = length_plot("prompt-lengths", "Prompt length", values, turns)
    assert [t.name for t in plot.traces] == ["turn 1", "turn 2", "turn 3"]  # a person counts from 1 (api/words.py)
    assert [sum(t.y) for t in plot.traces] == [334, 333, 333]
    (width,) = {t.width for t in plot.traces}
    assert width == 25 and len(plot.traces[0].x) == MAX_BINS  # 1000 token values in 40 bins of 25
    assert plot.traces[0].x[0] == 100 - 0.5 + 12.5 and plot.traces[0].x[-1] == 1099 - 0.5 - 12.5 + 1


def test_one_answer_a_line_is_one_trace_and_absent_lengths_are_counted_not_drawn() -> None:
    plot = length_plot("reasoning-lengths", "Reasoning", np.array([-1, 5, 5, 7, -1]), np.zeros(5, np.int64))
    (trace,) = plot.traces
    assert trace.name == "records" and sum(trace.y) == 3 and trace.x == [5.0, 6.0, 7.0] and trace.y == [2, 0, 1]
    assert "2 records without a think end left out" in plot.note
    empty = length_plot("reasoning-lengths", "Reasoning", np.array([-1]), np.zeros(1, np.int64))
    assert empty.traces == () and "1 record without a think end" in empty.note


def test_throughput_spreads_every_output_token_over_the_run() -> None:
    times = 1_796_000_000 + np.linspace(0, 99, 100)  # one answer a second for 100 s
    tokens = np.full(100, 50, np.int64)
    (trace,) = throughput_plot(times, tokens).traces
    width = trace.x[0]
    assert len(trace.y) == 20 and sum(trace.y) * width == pytest.approx(5000, rel=1e-3)  # every token, in 20 bins
    assert trace.y == [round(5 * 50 / width, 1)] * 20  # 5 answers of 50 tokens a bin, rounded for the page
    resumed = np.concatenate([times, times + 1000])  # a resume after a pause shows as empty bins
    (paused,) = throughput_plot(resumed, np.concatenate([tokens, tokens])).traces
    assert 0 in paused.y and paused.y[0] > 0 and paused.y[-1] > 0


def test_finish_reasons_most_frequent_first_and_checks_against_thresholds() -> None:
    (bars,) = finish_plot(Counter({"length": 2, "stop": 9, "abort": 1})).traces
    assert bars.x == ["stop", "length", "abort"] and bars.y == [9, 2, 1]
    checks = [
        CheckResult(name="integrity", passed=True),
        CheckResult(name="truncation", passed=False, rate=0.3, threshold=0.02),
        CheckResult(name="conversations", passed=True, rate=0.5),
    ]
    plot = checks_plot(checks)
    rate, threshold = plot.traces
    assert (rate.x, rate.y) == (["truncation", "conversations"], [0.3, 0.5])
    assert (threshold.kind, threshold.x, threshold.y) == ("marker", ["truncation"], [0.02])
    assert plot.note == "failed: truncation"
