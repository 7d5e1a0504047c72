"""How often a run's status may be written when only its numbers moved (progress, a token rate, a loading
timer): each run at most once every `Settings.progress_write_s`, and all runs together at most
`Settings.progress_writes_per_s`, by spacing every run's writes further apart as runs are added (fair: no run
waits longer than another). A condition that changes is never delayed. Pure: the shell passes the clock."""

from __future__ import annotations


def progress_spacing(spacing_s: float, runs: int, writes_per_s: float) -> float:
    """Seconds between one run's progress-only writes, with `runs` runs on this operator: `spacing_s`, or
    longer so that runs / spacing stays within `writes_per_s`."""
    return max(spacing_s, runs / writes_per_s)


def progress_write_due(last_write: float, now: float, spacing_s: float) -> bool:
    return now - last_write >= spacing_s
