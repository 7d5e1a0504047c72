"""Render helpers start only once inline rendering limits the run, never with the worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.prompts.render import HELPER_RENDER_SHARE, HELPER_WINDOW_S, RenderPool, helper_needed


def test_a_helper_is_needed_only_when_rendering_takes_a_fifth_of_a_long_enough_window() -> None:
    assert not helper_needed(10.0, HELPER_WINDOW_S / 2)  # too early to tell
    assert not helper_needed(HELPER_RENDER_SHARE * 3.0 * 0.9, 3.0)
    assert helper_needed(HELPER_RENDER_SHARE * 3.0, 3.0)


class _Clock:
    """The pool's clocks (time.monotonic and time.perf_counter), moved only by the test: the share of the event
    loop that rendering takes is decided by the costs below, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _SlowRenderer:
    """Stands for a renderer whose prompts take `cost_s` each (Jinja and tokenization, in the event loop)."""

    def __init__(self, cost_s: float, clock: _Clock) -> None:
        self.cost_s = cost_s
        self.clock = clock
        self.fast_path_mismatch = None

    def render(self, messages: Any, tools: Any, variables: Any = None) -> list[int]:
        self.clock.now += self.cost_s
        return [1, 2, 3]


@pytest.mark.parametrize(("cost_s", "idle_s", "starts"), [(0.02, 0.0, True), (0.001, 0.05, False)])
def test_the_pool_starts_helpers_lazily_when_inline_rendering_limits_the_run(
    monkeypatch: pytest.MonkeyPatch, cost_s: float, idle_s: float, starts: bool
) -> None:
    started: list[str] = []
    monkeypatch.setattr(RenderPool, "_start_helpers", lambda self, why: started.append(why))
    pool = RenderPool({}, Path("/unused"), False, processes=1)
    assert pool.executor is None and not started  # nothing starts with the worker
    clock = _Clock()
    pool.renderer = _SlowRenderer(cost_s, clock)  # type: ignore[assignment]

    async def run() -> None:
        with monkeypatch.context() as patched:  # the loop's own clock too, while it only yields (sleep(0))
            patched.setattr(time, "monotonic", clock)
            patched.setattr(time, "perf_counter", clock)
            deadline = clock.now + HELPER_WINDOW_S * 1.6
            while clock.now < deadline and not started:
                await pool.render([([{"role": "user", "content": "hi"}], None, None)] * 4)
                clock.now += idle_s  # the event loop's other work (answers, at GPU speed mostly waiting)
                await asyncio.sleep(0)

    asyncio.run(run())
    assert bool(started) is starts
    if starts:
        assert started[0].startswith("rendering took")
