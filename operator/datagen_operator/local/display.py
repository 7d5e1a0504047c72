"""What `datagen run` shows: each condition's transition as a line, the Loading and Progressing messages said
again while they move (without the live table they would stay at their first words), and the live table of the
conditions with a progress bar."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.duration import format_duration
from datagen_operator.api.reasons import Reason
from datagen_operator.api.status import PROGRESSING, SERVER_READY, Condition
from datagen_operator.control.conditions import transition_events
from datagen_operator.control.decision import Decision
from datagen_operator.control.progress import eta_seconds
from datagen_operator.control.server import loading_line_due

PROGRESS_REPORT_S = 5.0
"""How often a log without the live table repeats a changed Progressing message (done/total, tok/s)."""


@dataclass
class RunView:
    name: str
    """The DataGenRun's name, the live table's title."""
    console: Any
    live: bool
    started: float = field(default_factory=time.monotonic)
    loading_said_at: float | None = None
    progress_said: tuple[float | None, str] = (None, "")
    """When Progressing's message was last said (its transition event says the first), and what it said."""
    progress_from: tuple[float, int] = (0.0, 0)
    """When the workers began to be counted here, and the records done then: the rate the ETA is read from."""

    def say(self, text: str, colour: str = "white") -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(f"[dim]{elapsed:6.1f}s[/] [{colour}]{text}[/]", highlight=False, soft_wrap=True)

    def show(self, before: list[Condition], conditions: list[Condition], decision: Decision) -> None:
        """A pass's conditions: their transitions said, and the moving messages said again when due."""
        for event in transition_events(before, conditions):
            self.say(event.message, "yellow" if event.type == "Warning" else "white")
        self._repeat_loading(conditions)
        self._repeat_progress(conditions, decision)

    def _repeat_progress(self, conditions: list[Condition], decision: Decision) -> None:
        """Without the live table, Progressing's message (done/total, tok/s) would show only its first words
        while the workers run: say it again every PROGRESS_REPORT_S when it changed."""
        progressing = next((c for c in conditions if c.type == PROGRESSING), None)
        if self.live or progressing is None or progressing.reason != Reason.RUNNING:
            return
        now = time.monotonic()
        said_at, said = self.progress_said
        progress = decision.progress
        done, total = (progress.records_done, progress.records_total) if progress is not None else (0, 0)
        if said_at is None:  # its transition event has just said it
            self.progress_said = (now, progressing.message)
            self.progress_from = (now, done)
        elif progressing.message != said and now - said_at >= PROGRESS_REPORT_S:
            eta = eta_words(self.progress_from, (now, done), total)
            self.say(f"{progressing.type}={progressing.status} ({progressing.reason}): {progressing.message}{eta}")
            self.progress_said = (now, progressing.message)

    def _repeat_loading(self, conditions: list[Condition]) -> None:
        """Events show transitions only; without the live table the Loading message would stay at its first
        second for the whole load. Repeat it (its time moved) every LOADING_REPORT_S."""
        ready = next((c for c in conditions if c.type == SERVER_READY), None)
        if ready is None or ready.reason != Reason.LOADING:
            self.loading_said_at = None
            return
        now = time.monotonic()
        if self.loading_said_at is None:  # its transition event has just said it
            self.loading_said_at = now
        elif not self.live and loading_line_due(ready.reason, self.loading_said_at, now):
            self.say(f"{ready.type}={ready.status} ({ready.reason}): {ready.message}")
            self.loading_said_at = now

    def renderable(self, conditions: list[Condition], decision: Decision | None) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table(title=f"DataGenRun {self.name}", expand=True)
        for column in ("condition", "status", "reason", "message"):
            table.add_column(column, overflow="fold", ratio=4 if column == "message" else None)
        for c in conditions:
            colour = {"True": "green", "False": "red"}.get(c.status, "yellow")
            table.add_row(c.type, f"[{colour}]{c.status}[/]", c.reason, c.message)
        progress = decision.progress if decision is not None else None
        if progress is None or not progress.prompts_total:
            return table
        bar = Table.grid(padding=(0, 1))
        bar.add_row(
            ProgressBar(total=progress.prompts_total, completed=progress.prompts_done, width=50),
            progress.summary,
            f"shards {progress.shards_done}/{progress.shards_total}",
        )
        return Group(table, bar)

    def display(self, conditions: list[Condition]) -> Any:
        """The live table on a terminal, updated each pass; elsewhere the said lines are the display."""
        if self.live:
            from rich.live import Live

            return Live(self.renderable(conditions, None), console=self.console, refresh_per_second=4, transient=True)
        return _NoDisplay()


def eta_words(start: tuple[float, int], now: tuple[float, int], total: int) -> str:
    """', ETA 3m20s' at the rate records were done since `start` ((monotonic s, records done)), or '' before any
    (control/progress `eta_seconds`: the operator's status.progress.eta is read by the same rule)."""
    seconds = eta_seconds(start, now, total)
    return "" if seconds is None else f", ETA {format_duration(seconds)}"


class _NoDisplay:
    """Without a terminal the events are the display."""

    def __enter__(self) -> _NoDisplay:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: Any) -> None:
        return None
