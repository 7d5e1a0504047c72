"""The data of each plot in `datagen verify --html`: what a person looks at before training on an output.

Pure: the stored columns (Arrow batches; the writer reads them in one pass of its own after verify's) and verify's
result in, plots out, each a few traces of numbers. `steps/report_html.py` draws them; a plot with nothing to draw keeps its note saying why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from datagen_operator.api.flags import stored_finish_type
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import TURNS_COUNTED, plural, turn_label
from datagen_operator.checks.record_checks import Expectations
from datagen_operator.checks.record_columns import token_lengths

COLUMNS = ("input_ids", "output_ids", "finish_reason", "turn", "done_at")
"""The stored columns the plots read (readers.RecordBatches)."""

MAX_BINS = 40
"""Bars of a length histogram, and of throughput over time: enough to see a shape, few enough to read."""

LENGTHS = (
    ("prompt-lengths", "Prompt length", "prompt"),
    ("reasoning-lengths", "Reasoning length", "reasoning"),
    ("answer-lengths", "Answer length (after the think end)", "answer"),
)
"""(plot id, title, TokenLengths field) of each length distribution."""

Kind = Literal["bar", "line", "marker"]


@dataclass(frozen=True)
class Trace:
    name: str
    kind: Kind
    x: list[Any]
    y: list[float]
    width: float | None = None
    """A histogram's bin width (bars drawn edge to edge)."""


@dataclass(frozen=True)
class Plot:
    id: str
    """The plot's HTML id: stable, so a person (or a test) can find it."""
    title: str
    x_title: str
    y_title: str
    traces: tuple[Trace, ...]
    note: str = ""
    """What the plot shows beyond its title, or why it has nothing to show."""
    y_percent: bool = False


@dataclass
class Columns:
    """The per-record numbers the plots need, gathered batch by batch (six numbers a record)."""

    prompt: list[npt.NDArray[np.int64]] = field(default_factory=list)
    reasoning: list[npt.NDArray[np.int64]] = field(default_factory=list)
    answer: list[npt.NDArray[np.int64]] = field(default_factory=list)
    output: list[npt.NDArray[np.int64]] = field(default_factory=list)
    turn: list[npt.NDArray[np.int64]] = field(default_factory=list)
    done_at: list[npt.NDArray[np.float64]] = field(default_factory=list)
    """NaN where the record has no time (written before the column)."""
    finish: Counter[str] = field(default_factory=Counter)

    def add(self, batch: Any, expect: Expectations) -> None:
        import pyarrow.compute as pc

        lengths = token_lengths(batch, expect)
        self.prompt.append(lengths.prompt.astype(np.int64))
        self.reasoning.append(lengths.reasoning.astype(np.int64))
        self.answer.append(lengths.answer.astype(np.int64))
        self.output.append(pc.list_value_length(batch.column("output_ids")).to_numpy(zero_copy_only=False))
        self.turn.append(batch.column("turn").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64))
        names = batch.schema.names
        times = batch.column("done_at") if "done_at" in names else None
        self.done_at.append(
            np.full(batch.num_rows, np.nan)
            if times is None
            else times.cast("float64").fill_null(np.nan).to_numpy(zero_copy_only=False)
        )
        # The stored JSON strings are few distinct values: count them, then decode each once.
        for entry in pc.value_counts(batch.column("finish_reason")).to_pylist():
            text = entry["values"]
            kind = stored_finish_type(text)
            self.finish[kind or "none"] += entry["counts"]


def gather(batches: Iterable[Any], expect: Expectations) -> Columns:
    columns = Columns()
    for batch in batches:
        columns.add(batch, expect)
    return columns


def _joined(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    return np.concatenate([np.zeros(0, dtype), *parts])


def plots(columns: Columns, checks: Sequence[CheckResult], expect: Expectations) -> list[Plot]:
    """Every plot of the report, in page order."""
    turns = _joined(columns.turn, np.int64)
    out = [
        length_plot(plot_id, title, _joined(getattr(columns, name), np.int64), turns)
        for plot_id, title, name in LENGTHS
    ]
    if expect.think_end_id is None:
        out[1] = Plot("reasoning-lengths", "Reasoning length", "tokens", "records", (), "the model has no think end")
    out.append(finish_plot(columns.finish))
    out.append(checks_plot(checks))
    out.append(throughput_plot(_joined(columns.done_at, np.float64), _joined(columns.output, np.int64)))
    return out


def length_plot(plot_id: str, title: str, values: npt.NDArray[np.int64], turns: npt.NDArray[np.int64]) -> Plot:
    """A histogram of token counts (negative: absent, left out and counted), one trace per turn when the output holds
    regenerated conversations (turns past 0), over shared bins."""
    present = values >= 0
    absent = int((~present).sum())
    note = f"{_records(absent)} without a think end left out" if absent else ""
    values, turns = values[present], turns[present]
    if not len(values):
        return Plot(plot_id, title, "tokens", "records", (), note or "no records")
    edges = _integer_edges(int(values.min()), int(values.max()))
    width = float(edges[1] - edges[0])
    centres = ((edges[:-1] + edges[1:]) / 2).tolist()
    by_turn = sorted(set(turns.tolist()))
    by_turns = len(by_turn) > 1 or by_turn != [0]
    traces = []
    for turn in by_turn:
        counts, _ = np.histogram(values[turns == turn], edges)
        traces.append(
            Trace(turn_label(turn) if by_turns else "records", "bar", centres, counts.astype(float).tolist(), width)
        )
    shown = f"median {int(np.median(values))}, max {int(values.max())} tokens over {_records(len(values))}"
    counted = TURNS_COUNTED if by_turns else ""
    return Plot(plot_id, title, "tokens", "records", tuple(traces), "; ".join(filter(None, [shown, note, counted])))


def _integer_edges(low: int, high: int) -> npt.NDArray[np.float64]:
    """At most MAX_BINS bins of a whole number of tokens each, covering [low, high]."""
    width = max(1, -(-(high - low + 1) // MAX_BINS))
    bins = -(-(high - low + 1) // width)
    return np.asarray(low - 0.5 + width * np.arange(bins + 1), np.float64)


def finish_plot(finish: Counter[str]) -> Plot:
    kinds = sorted(finish, key=lambda kind: (-finish[kind], kind))
    traces = (Trace("records", "bar", kinds, [float(finish[k]) for k in kinds]),) if kinds else ()
    return Plot("finish-reasons", "Finish reasons", "finish_reason type", "records", traces, "SGLang's finish_reason")


def checks_plot(checks: Sequence[CheckResult]) -> Plot:
    """Each counted check's rate, and its threshold where it has one (a maximum for flag rates, a minimum for
    reasoning captured: the check's verdict says which)."""
    rated = [c for c in checks if c.rate is not None]
    traces = []
    if rated:
        traces.append(Trace("rate", "bar", [c.name for c in rated], [float(c.rate or 0.0) for c in rated]))
    limited = [c for c in rated if c.threshold is not None]
    if limited:
        traces.append(
            Trace("threshold", "marker", [c.name for c in limited], [float(c.threshold or 0) for c in limited])
        )
    failed = [c.name for c in checks if not c.passed]
    note = f"failed: {', '.join(failed)}" if failed else "every check passed"
    return Plot("check-rates", "Checks: rate against threshold", "check", "rate", tuple(traces), note, y_percent=True)


def throughput_plot(done_at: npt.NDArray[np.float64], outputs: npt.NDArray[np.int64]) -> Plot:
    """Output tokens per second over the run's wall time, from each record's `done_at`: bins of equal width from
    the first answer to the last (a resumed run's pause shows as empty bins)."""
    timed = ~np.isnan(done_at)
    untimed = int((~timed).sum())
    note = f"{_records(untimed)} without done_at (written before the column) left out" if untimed else ""
    times, tokens = done_at[timed], outputs[timed]
    if not len(times):
        return Plot("throughput", "Throughput over time", "seconds", "output tokens/s", (), note or "no records")
    start, span = float(times.min()), float(times.max() - times.min())
    bins = max(1, min(MAX_BINS, len(times) // 5))
    width = max(span / bins, 1e-3)
    slot = np.minimum(((times - start) / width).astype(np.int64), bins - 1)
    per_bin = np.bincount(slot, weights=tokens.astype(np.float64), minlength=bins)
    x = (width * (np.arange(bins) + 1)).round(3).tolist()  # each bin at its end: tokens answered by then
    rate = (per_bin / width).round(1).tolist()
    whole = f"{int(tokens.sum())} output tokens in {span:.3g} s from the first answer to the last"
    return Plot(
        "throughput", "Throughput over time", "seconds since the first answer", "output tokens/s",
        (Trace("output tokens/s", "line", x, rate),), "; ".join(filter(None, [whole, note])),
    )  # fmt: skip


def _records(n: int) -> str:
    return plural(n, "record")
