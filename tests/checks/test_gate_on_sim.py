"""The gate before bulk work, against the SGLang simulator: each seeds' mistake and each simulator
misconfiguration is caught by its check, with the fix in the message, and a correct setup passes."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aiohttp
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.canary import run_canary
from datagen_operator.steps.parser_check import verify_running_server
from tests.harness.sim import start_sim
from tests.manifests import local_spec

REPO = Path(__file__).resolve().parents[2]
KIMI_FLAGS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
SHORT = ("--sim-mean-reasoning-tokens", "40", "--sim-mean-answer-tokens", "24")


def spec_for(model_dir: Path) -> DataGenRunSpec:
    changes = {"generation": {"sampling": {"max_new_tokens": 2048}}, "checks.canaryPrompts": 4}
    return parse_spec(
        local_spec(model_dir, REPO / "examples" / "prompts" / "quickstart.jsonl", Path("/unused"), **changes)
    )


async def _parsers(url: str, spec: DataGenRunSpec) -> StepOutcome:
    async with aiohttp.ClientSession() as session:
        return await verify_running_server(session, url, spec)


def sim_request_count(url: str) -> int:
    """Generation requests the simulator served, from its Prometheus counter."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics") as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("sglang:num_requests_total"))
    return int(float(line.rsplit(" ", 1)[1]))


def parsers_outcome(url: str, spec: DataGenRunSpec) -> StepOutcome:
    return asyncio.run(_parsers(url, spec))


def canary_outcome(url: str, spec: DataGenRunSpec, model_dir: Path) -> StepOutcome:
    tokenizer = load_tokenizer(model_dir, trust_remote_code=False)
    return asyncio.run(run_canary(spec, tokenizer, Path(spec.dataset.path), [url]))


def test_correct_server_passes_the_whole_gate(standin_tokenizer: Path) -> None:
    spec = spec_for(standin_tokenizer)
    with start_sim(*KIMI_FLAGS, *SHORT) as sim:
        parsers = parsers_outcome(sim.url, spec)
        canary = canary_outcome(sim.url, spec, standin_tokenizer)
    assert parsers.passed, parsers.message
    assert canary.passed, canary.message
    assert {c.name for c in canary.checks} >= {"reasoning_captured", "token_counts", "termination", "tool_calls"}


def test_server_launched_without_a_reasoning_parser(standin_tokenizer: Path) -> None:
    with start_sim("--tool-call-parser", "kimi_k2", *SHORT) as sim:
        outcome = parsers_outcome(sim.url, spec_for(standin_tokenizer))
    assert not outcome.passed
    assert "without --reasoning-parser" in outcome.message
    assert "launch it with --reasoning-parser kimi_k2" in outcome.message


def test_server_launched_with_the_old_kimi_parser(standin_tokenizer: Path) -> None:
    with start_sim("--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", *SHORT) as sim:
        outcome = parsers_outcome(sim.url, spec_for(standin_tokenizer))
    assert not outcome.passed
    assert (
        "the server's reasoning parser is `kimi` (◁think▷) but kimi-k2.5 writes <think>; use kimi_k2" in outcome.message
    )


@pytest.mark.parametrize(
    ("misconfig", "expected"),
    [
        ("never-close-think", "kimi-k2.5 reasons but never closes its reasoning"),
        ("ignore-thinking", "kimi-k2.5 ignores thinking"),
    ],
)
def test_misconfigured_models_fail_the_canary_with_the_true_cause(
    standin_tokenizer: Path, misconfig: str, expected: str
) -> None:
    """The prompt prefills `<think>`, so neither misconfigured model writes a tag: the verdict comes from the
    same prompts sent with the think block closed, and it is the first thing the message says. (A model that
    writes another family's markers, `kimi-tags`, is named by them: test_think_markers_on_sim.py.)"""
    spec = spec_for(standin_tokenizer)
    # Reasoning several times the answer's length, as reasoning models write it (canary_judgment's ratio rule),
    # and every length its mean: the simulator draws each request's length anew, independent of the prompt, where
    # a model that ignores thinking writes the same answer with the block open or closed. Sampled, the median ratio
    # of a few answers crossed 1.8 now and then, either way (SHORT's 40 against 24 tokens: 1 run in about 8).
    reasoning = ("--sim-mean-reasoning-tokens", "120", "--sim-mean-answer-tokens", "24", "--sim-length-sigma", "0")
    with start_sim(*KIMI_FLAGS, *reasoning, "--sim-misconfig", misconfig) as sim:
        outcome = canary_outcome(sim.url, spec, standin_tokenizer)
    assert not outcome.passed
    assert outcome.message.startswith(expected), outcome.message
    assert outcome.checks[1].name == "model_thinking"


def test_prompt_rendered_with_thinking_off_fails_the_canary(standin_tokenizer: Path, tmp_path: Path) -> None:
    """A model dir whose chat template always closes the think block (an instruct template under a
    thinking preset): the canary names the render as the cause."""
    model_dir = tmp_path / "model"
    shutil.copytree(standin_tokenizer, model_dir)
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
    assert outcome.message.startswith(
        "7/7 rendered prompts end with an empty think block `<think></think>`: the chat template rendered thinking OFF"
    ), outcome.message
    assert "set generation.thinking: true" in outcome.message
    assert outcome.checks[0].name == "chat_template" and not outcome.checks[0].passed


def test_template_that_drops_the_prefill_is_named(standin_tokenizer: Path, tmp_path: Path) -> None:
    """The model opens `<think>` itself, so every output check passes: only the prompts show the template is not
    kimi-k2.5's."""
    model_dir = tmp_path / "model"
    shutil.copytree(standin_tokenizer, model_dir)
    template_file = model_dir / "chat_template.jinja"
    template = template_file.read_text()
    prefill = "{%- else -%}\n        <think>\n"
    assert prefill in template
    template_file.write_text(template.replace(prefill, "{%- else -%}\n"))
    spec = spec_for(model_dir)
    with start_sim(*KIMI_FLAGS, *SHORT) as sim:
        outcome = canary_outcome(sim.url, spec, model_dir)
    assert not outcome.passed
    assert outcome.message.startswith(
        "7/7 rendered prompts do not end with `<think>` although kimi-k2.5's chat template"
    )
    assert [c.name for c in outcome.checks if not c.passed] == ["chat_template"]


def test_long_reasoning_cut_by_the_canary_cap_is_asked_again_with_the_runs_budget(standin_tokenizer: Path) -> None:
    spec = spec_for(standin_tokenizer)
    spec = spec.model_copy(update={"checks": spec.checks.model_copy(update={"canary_max_new_tokens": 64})})
    flags = ("--sim-mean-reasoning-tokens", "400", "--sim-length-sigma", "0", "--enable-metrics")
    with start_sim(*KIMI_FLAGS, *flags) as sim:
        outcome = canary_outcome(sim.url, spec, standin_tokenizer)
        requests = sim_request_count(sim.url)
    assert outcome.passed, outcome.message
    assert requests == 2 * 7, "each of the 7 cut outputs is sent once more, with the run's max_new_tokens"


def test_prompts_the_template_cannot_render_or_the_server_refuses_are_set_aside(
    standin_tokenizer: Path, tmp_path: Path
) -> None:
    dataset = tmp_path / "prompts.jsonl"
    lines = [
        {"id": "fine-1", "messages": [{"role": "user", "content": "Hello"}]},
        {"id": "too-long", "messages": [{"role": "user", "content": "word " * 3000}]},
        {"id": "fine-2", "messages": [{"role": "user", "content": "Hi again"}]},
    ]
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    spec = spec_for(standin_tokenizer)
    spec = spec.model_copy(
        update={
            "dataset": spec.dataset.model_copy(update={"path": str(dataset)}),
            "checks": spec.checks.model_copy(update={"canary_prompts": 2}),
        }
    )
    with start_sim(*KIMI_FLAGS, *SHORT, "--context-length", "4096") as sim:
        outcome = canary_outcome(sim.url, spec, standin_tokenizer)
    assert outcome.passed, outcome.message
    assert "set aside 1 prompt: too-long (refused by the server: HTTP 400" in outcome.message


def test_prompt_suffix_leak_fails_the_canary(standin_tokenizer: Path) -> None:
    with start_sim(*KIMI_FLAGS, *SHORT, "--sim-prompt-suffix-leak", "2") as sim:
        outcome = canary_outcome(sim.url, spec_for(standin_tokenizer), standin_tokenizer)
    assert not outcome.passed
    assert "prompt-suffix tokens" in outcome.message


def test_a_model_that_opens_but_never_closes_its_reasoning_is_named(tmp_path: Path) -> None:
    """Kimi-K2-Thinking writes `<think>` itself: an opener without a closer needs no control to be named."""
    from datagen_operator.tokenizer.standin import ensure_standin

    model_dir = ensure_standin("kimi-k2-thinking")
    spec = spec_for(model_dir)
    spec = spec.model_copy(update={"model": spec.model.model_copy(update={"preset": "kimi-k2-thinking"})})
    with start_sim(*KIMI_FLAGS, *SHORT, "--sim-misconfig", "never-close-think", tokenizer_dir=model_dir) as sim:
        outcome = canary_outcome(sim.url, spec, model_dir)
    assert not outcome.passed
    assert outcome.message.startswith("kimi-k2-thinking opens `<think>` but never closes its reasoning"), (
        outcome.message
    )


def conversations_spec(model_dir: Path) -> DataGenRunSpec:
    changes = {
        "generation": {"sampling": {"max_new_tokens": 2048}, "turns": "all"},
        "checks.canaryPrompts": 4,
    }
    return parse_spec(
        local_spec(model_dir, REPO / "examples" / "prompts" / "quickstart.jsonl", Path("/unused"), **changes)
    )


def test_whole_conversations_prove_a_second_turn_carries_the_first_answer(standin_tokenizer: Path) -> None:
    with start_sim(*KIMI_FLAGS, *SHORT, "--enable-metrics") as sim:
        before = sim_request_count(sim.url)
        outcome = canary_outcome(sim.url, conversations_spec(standin_tokenizer), standin_tokenizer)
        sent = sim_request_count(sim.url) - before
    history = next(check for check in outcome.checks if check.name == "conversation_history")
    assert outcome.passed and history.passed, outcome.message
    assert "holds that answer" in history.verdict
    assert sent == 8  # 4 prompts + 3 probes + the second turn


def test_a_template_that_rewrites_earlier_answers_fails_the_canary_for_whole_conversations(
    standin_tokenizer: Path, tmp_path: Path
) -> None:
    """Every output check passes (the first turn is fine): only a second turn shows the history is not the model's."""
    model_dir = tmp_path / "model"
    shutil.copytree(standin_tokenizer, model_dir)
    template_file = model_dir / "chat_template.jinja"
    template = template_file.read_text()
    branch = "{{- render_role(message) -}}\n    {%- if message['role'] == 'assistant' -%}"
    assert branch in template
    rewrite = "{%- set message = {'role': 'assistant', 'content': 'I answered.'} -%}"
    template_file.write_text(template.replace(branch, f"{branch}\n        {rewrite}"))
    with start_sim(*KIMI_FLAGS, *SHORT) as sim:
        outcome = canary_outcome(sim.url, conversations_spec(model_dir), model_dir)
        one_answer = canary_outcome(sim.url, spec_for(model_dir), model_dir)
    assert one_answer.passed, one_answer.message  # one answer a line never renders history: nothing to catch
    assert not outcome.passed
    assert [c.name for c in outcome.checks if not c.passed] == ["conversation_history"]
    assert "the chat template drops or rewrites earlier assistant turns" in outcome.message
