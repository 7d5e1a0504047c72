"""control/throttle.py: a run's progress-only status writes are spaced, and all runs' together stay within the
operator's budget however many runs move at once, with no run waiting longer than another."""

from __future__ import annotations

from datagen_operator.control.throttle import progress_spacing, progress_write_due
from datagen_operator.k8s.settings import Settings


def writes_over(runs: int, seconds: float, tick_s: float = 0.5) -> list[int]:
    """Each run asks at every tick (its ConfigMaps move all the time); the writes each run made."""
    settings = Settings()
    spacing = progress_spacing(settings.progress_write_s, runs, settings.progress_writes_per_s)
    last = [-1e9] * runs
    made = [0] * runs
    now = 0.0
    while now < seconds:
        for run in range(runs):
            if progress_write_due(last[run], now, spacing):
                last[run], made[run] = now, made[run] + 1
        now += tick_s
    return made


def test_up_to_100_runs_write_every_5_s() -> None:
    for runs in (1, 10, 100):
        assert writes_over(runs, 60) == [12] * runs


def test_more_runs_space_their_writes_to_keep_the_total_within_the_budget() -> None:
    seconds, rate = 60, Settings().progress_writes_per_s
    for runs in (200, 1000):
        made = writes_over(runs, seconds)
        assert sum(made) <= rate * seconds + runs, (runs, sum(made))  # the budget, plus each run's first write
        assert max(made) - min(made) <= 1, (min(made), max(made))  # no run starves


def test_the_defaults_keep_status_about_10_s_behind_the_workers() -> None:
    from datagen_operator.worker.progress import ConfigMapSink

    worker_every = ConfigMapSink("x", "y").min_interval_s
    assert worker_every + Settings().progress_write_s <= 10.0
    assert Settings.from_env({"DATAGEN_PROGRESS_WRITES_PER_SECOND": "7"}).progress_writes_per_s == 7.0


def test_words_alone_are_written_at_most_every_30_s_by_default() -> None:
    assert Settings().message_write_s == 30.0  # a loading timer: ~2 writes a run a minute (bench/operator.py)
    assert Settings.from_env({"DATAGEN_MESSAGE_WRITE_SECONDS": "2"}).message_write_s == 2.0
