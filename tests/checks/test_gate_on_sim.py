"""The gate before bulk work, against the SGLang simulator: each seeds' mistake and each simulator
misconfiguration is caught by its check, with the fix in the message, and a correct setup passes."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiohttp
import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.checks.canary import run_canary
from datagen_operator.checks.server_truth import verify_running_server
from datagen_operator.control.observed import StepOutcome
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from datagen_operator.worker.render import load_tokenizer
from tests.harness.sim import start_sim

REPO = Path(__file__).resolve().parents[2]
KIMI_FLAGS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
SHORT = ("--sim-mean-reasoning-tokens", "40", "--sim-mean-answer-tokens", "24")


@pytest.fixture(scope="module")
def standin() -> Path:
    return ensure_standin_tokenizer()


def spec_for(model_dir: Path) -> DataGenRunSpec:
    return parse_run(
        {
            "apiVersion": "datagen.dev/v1alpha1",
            "kind": "DataGenRun",
            "metadata": {"name": "gate"},
            "spec": {
                "model": {"preset": "kimi-k2.5", "path": str(model_dir)},
                "dataset": {"path": str(REPO / "examples" / "prompts" / "quickstart.jsonl")},
                "generation": {"sampling": {"max_new_tokens": 2048}},
                "output": {"path": "/unused"},
                "checks": {"canaryPrompts": 4},
            },
        }
    ).spec


async def _parsers(url: str, spec: DataGenRunSpec) -> StepOutcome:
    async with aiohttp.ClientSession() as session:
        return await verify_running_server(session, url, spec)


def parsers_outcome(url: str, spec: DataGenRunSpec) -> StepOutcome:
    return asyncio.run(_parsers(url, spec))


def canary_outcome(url: str, spec: DataGenRunSpec, model_dir: Path) -> StepOutcome:
    tokenizer = load_tokenizer(model_dir, trust_remote_code=False)
    return asyncio.run(run_canary(spec, tokenizer, Path(spec.dataset.path), [url]))


def test_correct_server_passes_the_whole_gate(standin: Path) -> None:
    spec = spec_for(standin)
    with start_sim(*KIMI_FLAGS, *SHORT) as sim:
        parsers = parsers_outcome(sim.url, spec)
        canary = canary_outcome(sim.url, spec, standin)
    assert parsers.passed, parsers.message
    assert canary.passed, canary.message
    assert {c.name for c in canary.checks} >= {"reasoning_captured", "token_counts", "termination", "tool_calls"}


def test_server_launched_without_a_reasoning_parser(standin: Path) -> None:
    with start_sim("--tool-call-parser", "kimi_k2", *SHORT) as sim:
        outcome = parsers_outcome(sim.url, spec_for(standin))
    assert not outcome.passed
    assert "without --reasoning-parser" in outcome.message
    assert "launch it with --reasoning-parser kimi_k2" in outcome.message


def test_server_launched_with_the_old_kimi_parser(standin: Path) -> None:
    with start_sim("--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", *SHORT) as sim:
        outcome = parsers_outcome(sim.url, spec_for(standin))
    assert not outcome.passed
    assert (
        "the server's reasoning parser is `kimi` (◁think▷) but kimi-k2.5 writes <think>; use kimi_k2" in outcome.message
    )


@pytest.mark.parametrize(
    ("misconfig", "expected"),
    [
        ("never-close-think", "no `</think>` (163607)"),
        ("kimi-tags", "no `</think>` (163607)"),
        ("ignore-thinking", "no `</think>` (163607)"),
    ],
)
def test_misconfigured_models_fail_the_canary(standin: Path, misconfig: str, expected: str) -> None:
    spec = spec_for(standin)
    with start_sim(*KIMI_FLAGS, *SHORT, "--sim-misconfig", misconfig) as sim:
        outcome = canary_outcome(sim.url, spec, standin)
    assert not outcome.passed
    assert expected in outcome.message, outcome.message


def test_prompt_rendered_with_thinking_off_fails_the_canary(standin: Path, tmp_path: Path) -> None:
    """A model dir whose chat template always closes the think block (an instruct template under a
    thinking preset): the canary names the render as the cause."""
    model_dir = tmp_path / "model"
    shutil.copytree(standin, model_dir)
    switch = "{%- if thinking is defined and thinking is false -%}"
    template_file = model_dir / "chat_template.jinja"
    template_file.write_text(template_file.read_text().replace(switch, "{%- if true -%}"))
    config_file = model_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if isinstance(config.get("chat_template"), str):
        config["chat_template"] = config["chat_template"].replace(switch, "{%- if true -%}")
        config_file.write_text(json.dumps(config))
    spec = spec_for(model_dir)
    with start_sim(*KIMI_FLAGS, *SHORT) as sim:
        outcome = canary_outcome(sim.url, spec, model_dir)
    assert not outcome.passed
    assert "no `</think>` (163607) in 7/7 outputs" in outcome.message
    assert "the prompts end with `<think></think>`: thinking is off in the rendered template" in outcome.message
    assert "set generation.thinking: true" in outcome.message


def test_prompt_suffix_leak_fails_the_canary(standin: Path) -> None:
    with start_sim(*KIMI_FLAGS, *SHORT, "--sim-prompt-suffix-leak", "2") as sim:
        outcome = canary_outcome(sim.url, spec_for(standin), standin)
    assert not outcome.passed
    assert "prompt-suffix tokens" in outcome.message
