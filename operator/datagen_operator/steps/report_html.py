"""`datagen verify --html PATH`: one self-contained page of the plots people check before training on an output.

The plots' data is `checks/report_data.py`'s; here it is drawn with plotly, whose library is inlined once in the
page's head (no CDN, no MathJax), so the file opens with no network. Each plot's div has its plot's stable id.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Protocol

from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import plural
from datagen_operator.checks.record_checks import Expectations
from datagen_operator.checks.report_data import COLUMNS, Plot, gather, plots


class VerifyReport(Protocol):
    """What the page shows of steps/verify.py's VerifyReport (which imports this module)."""

    output: str
    checks: list[CheckResult]
    fingerprint_sha256: str | None
    expectations: Expectations | None

    @property
    def records(self) -> int: ...

    @property
    def passed(self) -> bool: ...


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
.pass { color: #1a7f37; } .fail { color: #cf222e; font-weight: bold; }
.note { color: #555; margin: 0.2em 0; }
"""


def write_html_report(path: Path, report: VerifyReport) -> int:
    """Read the plotted columns of report.output once and write the page; the bytes written."""
    from datagen_operator.output.readers import RecordBatches

    if report.expectations is None:
        raise ValueError("the report names no expectations (verify_output sets them): no think end to place")
    columns = gather(RecordBatches(report.output, COLUMNS), report.expectations)
    page = render_page(report, plots(columns, report.checks, report.expectations))
    data = page.encode()
    path.write_bytes(data)
    return len(data)


def render_page(report: VerifyReport, shown: list[Plot]) -> str:
    from plotly.offline import get_plotlyjs

    verdict = '<span class="pass">PASSED</span>' if report.passed else '<span class="fail">FAILED</span>'
    sections = "\n".join(_section(plot) for plot in shown)
    fingerprint = (
        f"<p>fingerprint sha256 {html.escape(report.fingerprint_sha256)}</p>" if report.fingerprint_sha256 else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>datagen verify {html.escape(report.output)}</title>
<style>{STYLE}</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>datagen verify {html.escape(report.output)}</h1>
<p>{plural(report.records, "record")}: {verdict}</p>
{fingerprint}
{_checks_table(report)}
{sections}
</body></html>
"""


def _checks_table(report: VerifyReport) -> str:
    def percent(value: float | None) -> str:
        return "-" if value is None else f"{value:.2%}"

    rows = "\n".join(
        f'<tr><td>{html.escape(c.name)}</td><td class="{"pass" if c.passed else "fail"}">'
        f"{'pass' if c.passed else 'FAIL'}</td><td>{percent(c.rate)}</td><td>{percent(c.threshold)}</td>"
        f"<td>{c.count}/{c.total}</td><td>{html.escape(c.verdict)}</td></tr>"
        for c in report.checks
    )
    head = "<tr><th>check</th><th>result</th><th>rate</th><th>threshold</th><th>count/total</th><th>verdict</th></tr>"
    return f'<table id="checks">{head}\n{rows}</table>'


def _section(plot: Plot) -> str:
    import plotly.io as pio

    note = f'<p class="note">{html.escape(plot.note)}</p>' if plot.note else ""
    figure = pio.to_html(
        _figure(plot), full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=plot.id,
        config={"displaylogo": False, "responsive": True},
    )  # fmt: skip
    return f"<section><h2>{html.escape(plot.title)}</h2>{note}\n{figure}</section>"


def _figure(plot: Plot) -> Any:
    import plotly.graph_objects as go

    figure = go.Figure()
    for trace in plot.traces:
        if trace.kind == "bar":
            figure.add_bar(name=trace.name, x=trace.x, y=trace.y, width=trace.width)
        elif trace.kind == "marker":
            figure.add_scatter(
                name=trace.name, x=trace.x, y=trace.y, mode="markers",
                marker={"symbol": "line-ew-open", "size": 28, "line": {"width": 3}},
            )  # fmt: skip
        else:
            # Every value a point of the line: plotly otherwise drops collinear points (a run of idle bins).
            figure.add_scatter(name=trace.name, x=trace.x, y=trace.y, mode="lines+markers", line={"simplify": False})
    multi_turn = sum(trace.kind == "bar" for trace in plot.traces) > 1 and plot.traces[0].width is not None
    figure.update_layout(
        xaxis_title=plot.x_title, yaxis_title=plot.y_title, height=360, margin={"t": 20},
        barmode="overlay" if multi_turn else "group", bargap=0.05 if plot.traces and plot.traces[0].width else None,
        showlegend=len(plot.traces) > 1,
    )  # fmt: skip
    if multi_turn:
        figure.update_traces(opacity=0.6, selector={"type": "bar"})
    if plot.y_percent:
        figure.update_yaxes(tickformat=".1%", rangemode="tozero")
    return figure
