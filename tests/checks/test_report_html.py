"""`datagen verify --html`: the report of a real regenerated output, opened in headless Chromium (Debian's package,
`hack/chromium.sh` installs it), draws every plot with its data and fetches nothing from the network."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter, defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.checks.report_data import COLUMNS, Plot, gather, plots, throughput_plot
from datagen_operator.cli import main as datagen
from datagen_operator.output.readers import RecordBatches, iter_records
from datagen_operator.steps.report_html import render_page
from datagen_operator.steps.verify_program import verify_here
from tests.harness.sim import start_sim
from tests.worker.simrun import SIM_FLAGS, run_inprocess, spec, write_dataset

CHROMIUM = Path("/usr/bin/chromium")


def chats(count: int) -> list[dict[str, Any]]:
    """Conversations of 1 to 3 user turns, each regenerated turn by turn."""
    items = []
    for i in range(count):
        messages = []
        for t in range(1 + i % 3):
            messages += [{"role": "user", "content": f"chat {i} question {t}?"}, {"role": "assistant", "content": "x"}]
        items.append({"id": f"c{i:03d}", "messages": messages})
    return items


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Kimi stand-in output, thinking on, generation.turns all; max_new_tokens 40 against ~24 reasoning + ~16
    answer tokens, so some answers end `length` (and end their conversation)."""
    root = tmp_path_factory.mktemp("report")
    output = root / "out"
    sampling = {"max_new_tokens": 40, "temperature": 0.6, "sampling_seed": 0}
    changes = {"generation.turns": "all", "generation.sampling": sampling}
    document = spec(write_dataset(root / "chats.jsonl", chats(24)), output, **changes)
    # Seeded under deterministic inference, as SGLang reproduces answers: the same output each time.
    with start_sim(*SIM_FLAGS, "--sim-seed", "3", "--enable-deterministic-inference") as sim:
        assert run_inprocess(document, [sim.url]) == EXIT_OK
    run = {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "r"}, "spec": document}
    (output / "run.yaml").write_text(yaml.safe_dump(run))
    return output


BAR = re.compile(r"M[-\d.]+,([-\d.]+)V([-\d.]+)H[-\d.]+V[-\d.]+Z")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class RenderedPlots(HTMLParser):
    """The rendered DOM's plot divs (by id) and, per SVG trace in order: its kind, the bars of non-zero height or
    the markers it drew, and the points of its line (0 without one)."""

    def __init__(self, ids: set[str]) -> None:
        super().__init__()
        self.ids = ids
        self.stack: list[tuple[str, set[str], str | None]] = []
        self.drawn: dict[str, list[list[Any]]] = defaultdict(list)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.append((tag, found))
        classes = set((found.get("class") or "").split())
        plot = next((i for _, _, i in reversed(self.stack) if i in self.ids), None)
        if tag not in VOID:
            self.stack.append((tag, classes, found.get("id")))
        if plot is None:
            return
        traces = self.drawn[plot]
        if tag == "g" and "trace" in classes:
            traces.append(["bar" if "bars" in classes else "scatter", 0, 0])
        d = found.get("d") or ""
        if tag != "path" or not d or not traces:
            return
        bar = BAR.fullmatch(d)
        if traces[-1][0] == "bar" and bar is not None:
            traces[-1][1] += float(bar[1]) != float(bar[2])  # a zero count draws a bar of no height
        elif "point" in classes:
            traces[-1][1] += 1
        elif "js-line" in classes:
            traces[-1][2] = d.count("L") + 1

    def handle_endtag(self, tag: str) -> None:
        if any(open_tag == tag for open_tag, _, _ in self.stack):
            while self.stack.pop()[0] != tag:
                pass


def chromium_dom(page: Path) -> str:
    """The page's DOM after its scripts ran, in headless Chromium with every host name unresolvable (no network)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run hack/chromium.sh (apt-get install -y chromium) or make test")
    result = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def expected_drawing(plot: Plot) -> list[list[Any]]:
    """What each trace must draw: a bar per non-zero count, a marker per value, a line through every value."""
    return [
        ["bar", sum(y > 0 for y in trace.y), 0] if trace.kind == "bar"
        else ["scatter", len(trace.y), len(trace.y) if trace.kind == "line" else 0]
        for trace in plot.traces
    ]  # fmt: skip


def test_every_plot_draws_its_data_offline(regenerated: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    started = time.perf_counter()
    # The answers cut at max_new_tokens fail the truncation check: the page is written all the same.
    assert datagen(["verify", str(regenerated), "--html", str(page)]) == EXIT_FAILED_VERDICT
    print(f"report {page.stat().st_size} bytes, verify --html {time.perf_counter() - started:.2f} s")

    # The plots' data, from the store's own reader and verify's result: what the page must show.
    report = verify_here(regenerated, regenerated / "run.yaml").report
    assert report.expectations is not None
    shown = plots(gather(RecordBatches(regenerated, COLUMNS), report.expectations), report.checks, report.expectations)
    records = list(iter_records(regenerated))
    by_id = {plot.id: plot for plot in shown}
    assert set(by_id) == {"prompt-lengths", "reasoning-lengths", "answer-lengths", "finish-reasons", "check-rates",
                          "throughput"}  # fmt: skip
    finish = Counter(r["finish_reason"]["type"] for r in records)
    (bars,) = by_id["finish-reasons"].traces
    assert dict(zip(bars.x, bars.y, strict=True)) == finish and len(finish) == 2  # stop, and length cut
    turns = sorted({r["turn"] for r in records})
    assert turns == [0, 1, 2]
    for name in ("prompt-lengths", "reasoning-lengths", "answer-lengths"):
        # A person's turn 1 is the stored `turn` 0, as the text report counts them; the plot says so.
        assert [t.name for t in by_id[name].traces] == [f"turn {t + 1}" for t in turns], name
        assert "turns are counted from 1: turn 1 is the records' `turn` 0" in by_id[name].note
    prompt_turns = by_id["prompt-lengths"].traces
    assert [sum(t.y) for t in prompt_turns] == [sum(r["turn"] == t for r in records) for t in turns]
    assert sum(by_id["throughput"].traces[0].y) > 0

    text = page.read_text()
    (library_attrs, library), *figures = re.findall(r"<script\b([^>]*)>(.*?)</script>", text, flags=re.S)
    assert "Plotly" in library and len(library) > 1_000_000  # plotly.js, inlined once, in the head
    assert len(figures) == len(shown) and all("Plotly.newPlot" in body and len(body) < 100_000 for _, body in figures)
    assert not library_attrs.strip() and not any(attrs.strip() for attrs, _ in figures)  # no src
    # The library's own text names URLs (map tiles, its licence); nothing else on the page does.
    assert not re.search(r"https?://", re.sub(r"<script\b[^>]*>.*?</script>", "", text, flags=re.S))
    assert not any(re.search(r"https?://", body) for _, body in figures)
    rendered = RenderedPlots(set(by_id))
    rendered.feed(chromium_dom(page))
    loads = [
        (t, a) for t, a in rendered.tags if t in ("script", "link", "img", "iframe") and (a.get("src") or a.get("href"))
    ]
    assert not loads, loads  # after its scripts ran, the page still loads nothing
    for plot in shown:
        assert plot.traces, f"{plot.id} has no data: {plot.note}"
        assert rendered.drawn[plot.id] == expected_drawing(plot), plot.id


def test_lengths_are_where_the_think_end_is(regenerated: Path) -> None:
    """The reasoning and answer lengths, against each record's own first `</think>` (the Kimi prompt opens the
    reasoning)."""
    report = verify_here(regenerated, regenerated / "run.yaml").report
    assert report.expectations is not None
    columns = gather(RecordBatches(regenerated, COLUMNS), report.expectations)
    end = report.expectations.think_end_id
    records = list(iter_records(regenerated))
    reasoning = [r["output_ids"].index(end) if end in r["output_ids"] else -1 for r in records]
    answer = [
        len(r["output_ids"]) - at - 1 if at >= 0 else len(r["output_ids"])
        for r, at in zip(records, reasoning, strict=True)
    ]
    assert sorted(np.concatenate(columns.reasoning).tolist()) == sorted(reasoning)
    assert sorted(np.concatenate(columns.answer).tolist()) == sorted(answer)
    assert sorted(np.concatenate(columns.prompt).tolist()) == sorted(len(r["input_ids"]) for r in records)
    assert -1 in reasoning and max(reasoning) > 0  # cut inside the reasoning, and reasoned


def test_an_output_without_done_at_says_so() -> None:
    plot = throughput_plot(np.full(3, np.nan), np.ones(3, np.int64))
    assert plot.traces == () and "3 records without done_at" in plot.note


def test_a_line_through_idle_bins_draws_every_bin(regenerated: Path, tmp_path: Path) -> None:
    """Answers at the start and the end only: the empty bins between lie on one line, and each is still drawn."""
    done_at = np.array([0.0] * 5 + [60.0] * 30)
    plot = throughput_plot(done_at, np.full(35, 10, np.int64))
    (trace,) = plot.traces
    assert trace.y[1:-1].count(0.0) >= 3  # collinear points the line could skip
    page = tmp_path / "report.html"
    page.write_text(render_page(verify_here(regenerated, regenerated / "run.yaml").report, [plot]))
    rendered = RenderedPlots({plot.id})
    rendered.feed(chromium_dom(page))
    assert rendered.drawn[plot.id] == expected_drawing(plot) == [["scatter", len(trace.y), len(trace.y)]]
