"""`datagen verify`'s report on the terminal (rich): the checks table, the prompts set aside by cause, and a few
examples of each flag with special tokens shown."""

from __future__ import annotations

from typing import Any

from datagen_operator.api.words import plural
from datagen_operator.steps.verify import VerifyReport


def render_report(report: VerifyReport, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 140))
    verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
    console.print(f"\n[bold]datagen verify[/] {report.output}: {plural(report.records, 'record')} — {verdict}")
    if report.fingerprint_sha256:
        console.print(f"fingerprint sha256 {report.fingerprint_sha256[:16]}…")
    table = Table(show_lines=False)
    for column in ("check", "result", "rate", "threshold", "bound", "count/total", "verdict"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(
            c.name,
            "[green]pass[/]" if c.passed else "[red]FAIL[/]",
            "-" if c.rate is None else f"{c.rate:.2%}",
            "-" if c.threshold is None else f"{c.threshold:.2%}",
            "-" if c.bound is None else f"{c.bound:.2%}",
            f"{c.count}/{c.total}",
            c.verdict,
        )
    console.print(table)
    if report.set_aside:
        causes = ", ".join(f"{cause} {count}" for cause, count in sorted(report.set_aside.items()))
        console.print(f"set aside, never sent (reasons in shards/*/rejects.jsonl): {causes}")
    if report.examples:
        examples = Table(title="examples (special tokens shown)", show_lines=True)
        for column in ("flag", "id#sample", "prompt tail ⟶ output around the think end"):
            examples.add_column(column, overflow="fold")
        for e in report.examples:
            examples.add_row(e.flag, f"{e.id}#{e.sample}", e.excerpt)
        console.print(examples)
