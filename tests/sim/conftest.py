"""Fixtures for the simulator tests: servers on loopback started through tests/harness/sim.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.sim import SimServer, start_sim, start_sims

# Short outputs keep the suite fast; tools declared in a prompt are always called (rate 1).
SHORT = ("--sim-mean-answer-tokens", "60", "--sim-mean-reasoning-tokens", "80")
KIMI_PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")


@pytest.fixture(scope="session")
def sim(standin_tokenizer: Path) -> Iterator[SimServer]:
    """A simulator configured as the Kimi-K2.5 preset launches SGLang, with metrics."""
    with start_sim(*KIMI_PARSERS, "--enable-metrics", "--sim-tool-call-rate", "1", *SHORT) as server:
        yield server


# Simulators with one behaviour each, started together (in parallel) the first time a test needs one.
VARIANTS: dict[str, tuple[str, ...]] = {
    # Launched as the operator launches SGLang for a streaming run on 8 GPUs.
    "incremental": (
        "--incremental-streaming-output",
        "--tp",
        "8",
        "--dp-size",
        "2",
        "--mem-fraction-static",
        "0.85",
        "--trust-remote-code",
        "--served-model-name",
        "kimi-k2.5",
        "--log-level",
        "warning",
        "--watchdog-timeout",
        "600",
        "--reasoning-parser",
        "auto",
        *SHORT,
    ),
    "gpu": (
        "--sim-speed",
        "gpu",
        "--max-running-requests",
        "1",
        "--sim-tokens-per-s",
        "100",
        "--sim-ttft-s",
        "0",
        "--enable-metrics",
        "--sim-mean-answer-tokens",
        "1000",
        "--sim-length-sigma",
        "0",
    ),
    "fallback": ("--model-path", "/nonexistent/kimi-k2.5", "--sim-fallback-standin", *SHORT),
    "no_parser": ("--tool-call-parser", "kimi_k2", "--sim-tool-call-rate", "1", *SHORT),
    "qwen3": ("--reasoning-parser", "qwen3", *SHORT),
    "deepseek_r1": ("--reasoning-parser", "deepseek-r1", *SHORT),
    "kimi": ("--reasoning-parser", "kimi", *SHORT),
    "never_close_think": (*KIMI_PARSERS, "--sim-misconfig", "never-close-think", "--sim-tool-call-rate", "1", *SHORT),
    "kimi_tags": (*KIMI_PARSERS, "--sim-misconfig", "kimi-tags", *SHORT),
    "ignore_thinking": (*KIMI_PARSERS, "--sim-misconfig", "ignore-thinking", *SHORT),
    "leak": ("--sim-prompt-suffix-leak", "3", *SHORT),
    "fault_5xx": ("--sim-fault-5xx-rate", "1", "--sim-fault-5xx-status", "503", *SHORT),
    "fault_reset": ("--sim-fault-reset-rate", "1", *SHORT),
    "fault_stream_error": ("--sim-fault-stream-error-rate", "1", "--incremental-streaming-output", *SHORT),
    "fault_abort": ("--sim-fault-abort-rate", "1", *SHORT),
    "fault_hang": ("--sim-fault-hang-s", "30", *SHORT),
    "fault_half": ("--sim-fault-5xx-rate", "0.5", "--sim-seed", "7", *SHORT),
}


@pytest.fixture(scope="session")
def fleet(standin_tokenizer: Path) -> Iterator[dict[str, SimServer]]:
    names = list(VARIANTS)
    with start_sims([VARIANTS[name] for name in names]) as servers:
        yield dict(zip(names, servers, strict=True))


@pytest.fixture
def sim_factory(standin_tokenizer: Path) -> Iterator[Callable[..., SimServer]]:
    """Start a dedicated simulator with the given flags; stopped at the end of the test."""
    started: list[SimServer] = []

    def start(*flags: str, wait_ready: bool = True, env: dict[str, str] | None = None) -> SimServer:
        server = start_sim(*flags, wait_ready=wait_ready, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def sims_factory(standin_tokenizer: Path) -> Iterator[Callable[..., list[SimServer]]]:
    """Start several dedicated simulators in parallel; stopped at the end of the test."""
    contexts = []

    def start(*flag_sets: tuple[str, ...]) -> list[SimServer]:
        context = start_sims(flag_sets)
        contexts.append(context)
        return context.__enter__()

    yield start
    for context in contexts:
        context.__exit__(None, None, None)
