"""steps.canary: the verdict over a few real prompts' raw token ids, before any bulk record."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.flags import NO_THINK_END, PROMPT_CLOSES_THINK, TOKEN_COUNT_MISMATCH, TRUNCATED
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.canary_judgment import CanaryRecord, judge_canary, markers_seen, vocabulary_families
from datagen_operator.checks.evaluate import CheckContext, check_context
from datagen_operator.engine.model_configs import read_model_eos_ids
from datagen_operator.presets import get_preset, preset_names
from datagen_operator.presets.think_markers import ThinkMarkers, known_markers, preset_markers
from datagen_operator.prompts.render import Renderer, load_tokenizer, template_variables
from datagen_operator.tokenizer.standin import ensure_standin
from tests.manifests import local_spec

CTX = CheckContext(True, "kimi-k2.5", "<think>", "</think>", 163607, ChecksSpec())


def record(flags, output=(1, 163607, 2, 163586), tools=False) -> CanaryRecord:
    return CanaryRecord("p", [163606], list(output), {"type": "stop"}, len(output), tools, frozenset(flags))


def test_canary_passes_clean_records_and_forgives_capped_truncation() -> None:
    outcome = judge_canary([record(()), record((TRUNCATED,), output=(1, 2))], CTX, capped=True)
    assert outcome.passed, outcome.message


def test_canary_fails_on_any_raw_token_problem() -> None:
    outcome = judge_canary([record(()), record((TOKEN_COUNT_MISMATCH,))], CTX, capped=True)
    assert not outcome.passed and "completion_tokens" in outcome.message


def test_canary_that_never_sees_a_think_end_is_inconclusive() -> None:
    outcome = judge_canary([record((TRUNCATED,), output=(1, 2, 3))] * 3, CTX, capped=True)
    assert not outcome.passed and "raise generation.sampling.max_new_tokens" in outcome.message


def test_canary_verdict_survives_the_termination_message() -> None:
    outcome = judge_canary([record((NO_THINK_END, PROMPT_CLOSES_THINK), output=(5, 163586))] * 8, CTX, capped=False)
    data = outcome.for_storage()
    assert len(data) <= 4096
    back = StepOutcome.from_storage(data)
    assert (back.passed, back.reason, back.message) == (outcome.passed, outcome.reason, outcome.message)


def test_thinking_control_reads_the_median_length_ratio() -> None:
    from datagen_operator.checks.canary_judgment import ThinkingControl, judge_thinking_control

    answers_only = ThinkingControl((0.8, 1.1, 1.3, 9.0))  # one unusually long answer decides nothing
    assert "ignores thinking" in judge_thinking_control(answers_only, CTX, "kimi-k2.5").verdict
    reasoning = ThinkingControl((6.5, 8.0, 0.9, 7.2))
    verdict = judge_thinking_control(reasoning, CTX, "kimi-k2.5").verdict
    assert "reasons but never closes its reasoning" in verdict and "x6.8" in verdict  # median of 6.5 and 7.2


# -- every preset's model writing another family's think markers -------------------------------------------------
REPO = Path(__file__).resolve().parents[3]
PROMPT = [{"role": "user", "content": "Is 221 prime? Show your reasoning briefly."}]


@cache
def run_of(preset: str) -> tuple[ResolvedModel, Any, rc.Expectations, list[int]]:
    """The preset's run on its stand-in tokenizer: what it expects, and one rendered prompt."""
    model_dir = ensure_standin(preset)
    changes = {"model.preset": preset, "generation.thinking": get_preset(preset).thinking.default}
    spec = parse_spec(local_spec(model_dir, REPO / "examples" / "prompts" / "quickstart.jsonl", Path("/x"), **changes))
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=False)
    input_ids = Renderer(tokenizer, template_variables(resolved)).render(PROMPT, None)
    return resolved, tokenizer, rc.expectations_for(resolved, tokenizer, read_model_eos_ids(model_dir)), input_ids


def written_by_another_family(preset: str, markers: ThinkMarkers) -> CanaryRecord:
    """Reasoning inside `markers` (the opener only where the prompt did not open the reasoning), then an answer
    and the preset's stop token."""
    _, tokenizer, expect, input_ids = run_of(preset)

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    opened = bool(expect.think_start_ids) and rc.prompt_opens_think(input_ids, expect)
    stop = tokenizer.convert_tokens_to_ids(get_preset(preset).stop_tokens[0].text)
    output = [*([] if opened else ids(markers.start)), *ids("221 = 13 x 17."), *ids(markers.end), *ids("No."), stop]
    flags = rc.inspect_record(input_ids, output, {"type": "stop"}, len(output), False, expect)
    return CanaryRecord("probe:reasoning", input_ids, output, {"type": "stop"}, len(output), False, flags)


@pytest.mark.parametrize(
    ("preset", "markers"),
    [
        (name, markers)
        for name in preset_names()
        for markers in known_markers()
        if markers != preset_markers(get_preset(name))
    ],
    ids=lambda value: value if isinstance(value, str) else value.start,
)
def test_every_presets_model_writing_other_markers_is_named(preset: str, markers: ThinkMarkers) -> None:
    resolved, tokenizer, expect, _ = run_of(preset)
    records = [written_by_another_family(preset, markers)] * 3
    seen = markers_seen(records, expect, vocabulary_families(tokenizer))
    assert seen is not None and seen.written.markers == markers and seen.outputs == 3
    ctx = replace(check_context(resolved, ChecksSpec(), expect.think_end_id), markers_seen=seen)
    outcome = judge_canary(records, ctx, capped=False)
    assert not outcome.passed
    shown = f"`{markers.start}`…`{markers.end}`" if seen.written.opener_written else f"`{markers.end}`"
    expected = f", not {preset}'s" if resolved.think_end else f" although {preset} does not reason"
    assert f"3/3 outputs write {shown}{expected}" in outcome.message, outcome.message
    assert f"the model at model.path is not a {preset} model, or {preset} is the wrong preset" in outcome.message
    assert "does not think" not in outcome.message and "never closed" not in outcome.message


def test_own_markers_are_not_other_markers() -> None:
    _, tokenizer, expect, input_ids = run_of("qwen3")
    think = [*tokenizer.encode("<think>a</think>b", add_special_tokens=False), 151645]
    record = CanaryRecord("p", input_ids, think, {"type": "stop"}, len(think), False, frozenset())
    assert markers_seen([record], expect, ("qwen3",)) is None


# -- a dataset line's own thinking switch (chat_template_kwargs) ----------------------------------------------------
def judged_lines(changes: dict[str, Any], preset: str, lines: list[dict[str, Any]]) -> Any:
    """The canary's template verdict over a probe and `lines` ({"id", "kwargs"}), rendered as the canary renders
    them (the line's kwargs over the run's variables) on the preset's stand-in tokenizer."""
    from datagen_operator.checks.template_check import judge_template
    from datagen_operator.steps.canary import PROBES, rendered_prompt

    model_dir = ensure_standin(preset)
    spec = parse_spec(local_spec(model_dir, REPO / "examples" / "prompts" / "quickstart.jsonl", Path("/x"), **changes))
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=False)
    renderer = Renderer(tokenizer, template_variables(resolved))
    expect = rc.expectations_for(resolved, tokenizer, read_model_eos_ids(model_dir))
    prompts = [dict(PROBES[0])] + [
        {"id": line["id"], "line": number, "messages": PROMPT, "variables": line["kwargs"]}
        for number, line in enumerate(lines, start=1)
    ]
    judged = [rendered_prompt(p, renderer.render(p["messages"], None, p.get("variables")), resolved) for p in prompts]
    from datagen_operator.steps.canary import _template_expectation

    return judge_template(judged, expect, _template_expectation(resolved, spec))


def test_a_line_that_turns_thinking_off_itself_passes_the_template_check() -> None:
    """Qwen3 in a thinking run, one line with `enable_thinking: false`: its prompt closes the think block, as the
    line asked; it is not "the template rendered thinking OFF" (the workers and verify judge it off too)."""
    lines = [{"id": "a", "kwargs": None}, {"id": "b", "kwargs": {"enable_thinking": False}}]
    verdict = judged_lines({"model.preset": "qwen3", "generation.thinking": True}, "qwen3", lines)
    assert verdict.passed, verdict.verdict
    assert verdict.verdict == (
        "3/3 rendered prompts end as the template should (thinking on; 1 thinking off by their line's own switch)"
    )


def test_a_lines_switch_the_template_ignores_is_named_as_the_cause() -> None:
    """No preset: `enable_thinking` is one of the generic switches, so a line setting it false is judged off; the
    Kimi template reads only `thinking` and renders thinking on. The cause is the line's switch: the verdict names
    the line and its key, and does not send the user to generation.thinking."""
    changes = {
        "model.preset": None, "model.thinkTokens": {"start": "<think>", "end": "</think>"},
        "server.reasoningParser": "kimi_k2", "server.toolCallParser": "kimi_k2", "generation.thinking": True,
    }  # fmt: skip
    lines = [{"id": "a", "kwargs": None}, {"id": "b", "kwargs": {"enable_thinking": False}}]
    verdict = judged_lines(changes, "kimi-k2.5", lines)
    assert not verdict.passed and verdict.count == 1 and verdict.total == 3
    assert verdict.verdict.startswith(
        "1/3 rendered prompts do not close the think block (`<think></think>`) although their dataset line turns "
        "thinking off itself (line 2 (id 'b'): chat_template_kwargs {\"enable_thinking\": false}): the chat "
        "template does not follow the line's `enable_thinking: false`; remove that key from those lines"
    ), verdict.verdict
    assert "set generation.thinking" not in verdict.verdict


def test_a_lines_other_key_that_moves_the_think_block_is_named_not_generation_thinking() -> None:
    """A line whose own kwargs hold no switch the run knows, yet its prompt ends thinking off in a thinking run:
    the run's own prompts end thinking on, so the line's keys are named (not `set generation.thinking: true`)."""
    from datagen_operator.checks.template_check import RenderedPrompt, TemplateExpectation, judge_template

    model_dir = ensure_standin("qwen3")
    changes = {"model.preset": "qwen3", "generation.thinking": True}
    spec = parse_spec(local_spec(model_dir, REPO / "examples" / "prompts" / "quickstart.jsonl", Path("/x"), **changes))
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=False)
    renderer = Renderer(tokenizer, template_variables(resolved))
    expect = rc.expectations_for(resolved, tokenizer, read_model_eos_ids(model_dir))
    on = renderer.render(PROMPT, None)
    off = renderer.render(PROMPT, None, {"enable_thinking": False})  # what a key the template reads did
    judged = [RenderedPrompt(on), RenderedPrompt(off, "line 7 (id 'g')", {"no_think": True})]
    verdict = judge_template(judged, expect, TemplateExpectation("qwen3", "<think>", "</think>", "enable_thinking"))
    assert not verdict.passed and verdict.count == 1
    assert verdict.verdict.startswith(
        "1/2 rendered prompts end with an empty think block `<think></think>` although the run asks thinking on, "
        "and each comes from a dataset line with its own chat_template_kwargs (line 7 (id 'g'): chat_template_kwargs "
        '{"no_think": true}): a key of those lines switches the template\'s thinking'
    ), verdict.verdict
    assert "set generation.thinking" not in verdict.verdict
    # Where the run's own prompts end thinking off too, the template is the cause for all: the line is not blamed.
    everywhere = [RenderedPrompt(off), RenderedPrompt(off, "line 7 (id 'g')", {"no_think": True})]
    verdict = judge_template(everywhere, expect, TemplateExpectation("qwen3", "<think>", "</think>", "enable_thinking"))
    assert verdict.verdict == (
        "2/2 rendered prompts end with an empty think block `<think></think>`: the chat template rendered thinking "
        "OFF in a thinking run; set generation.thinking: true and check the template variable `enable_thinking`"
    )


class _Names:
    """Decodes ids as their names (100: the stop token, special)."""

    NAMES: dict[int, str] = {1: "<think>", 2: "plan", 3: "</think>", 4: "answer", 100: "<|im_end|>"}  # noqa: RUF012

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.NAMES[i] for i in ids if not (skip_special_tokens and i >= 100))


class _Recorder:
    """A renderer that records the messages of each prompt it renders."""

    def __init__(self) -> None:
        self.tokenizer, self.chat_template, self.variables = _Names(), None, {"enable_thinking": True}
        self.rendered: list[list[dict[str, Any]]] = []

    def render(self, messages: list[dict[str, Any]], tools: Any, variables: Any = None) -> list[int]:
        self.rendered.append(messages)
        return [4]


@pytest.mark.parametrize("history_reasoning", ["keep", "drop"])
def test_the_canarys_second_turn_sends_history_as_the_workers_do(history_reasoning: str) -> None:
    import asyncio
    from types import SimpleNamespace

    from datagen_operator.steps.canary import FOLLOW_UP, history_probe

    prompt = {"id": "a", "messages": [{"role": "user", "content": "q"}], "tools": None, "variables": None}
    record = CanaryRecord("a", [7], [1, 2, 3, 4, 100], {"type": "stop", "matched": 100}, 5, False, frozenset())
    renderer = _Recorder()
    resolved = SimpleNamespace(
        reasoning_parser="qwen3", tool_call_parser="qwen25", think_start="<think>", think_end="</think>"
    )

    async def send(*_: Any) -> None:
        return None

    verdict = asyncio.run(
        history_probe([(prompt, [7])], [record], renderer, resolved, send, {}, history_reasoning)  # type: ignore[arg-type]
    )
    assert verdict.passed, verdict.verdict
    answer = {"role": "assistant", "content": "answer", "reasoning_content": "plan"}
    if history_reasoning == "drop":
        del answer["reasoning_content"]
    assert renderer.rendered == [[prompt["messages"][0], answer, {"role": "user", "content": FOLLOW_UP}]]


def test_the_canary_reads_the_dataset_only_as_far_as_the_prompts_it_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug 2 (issue 48): the canary's prompts are drawn as needed, not a plan of the whole dataset first."""
    import itertools
    import json

    from datagen_operator.prompts.dataset_ref import DatasetRef
    from datagen_operator.prompts.scan import ShardScan
    from datagen_operator.steps.canary import PROBES, iter_canary_prompts

    dataset = tmp_path / "prompts.jsonl"
    lines = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(1000)]
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = 0
    scan = ShardScan.__iter__

    def counted(self: ShardScan) -> Any:
        nonlocal read
        for item in scan(self):
            read += 1
            yield item

    monkeypatch.setattr(ShardScan, "__iter__", counted)
    drawn = iter_canary_prompts(DatasetRef(dataset, "jsonl"), history_reasoning="keep")
    taken = list(itertools.islice(drawn, len(PROBES) + 4))
    assert [p["id"] for p in taken[len(PROBES) :]] == ["p0", "p1", "p2", "p3"]
    assert read == 4


def test_the_canarys_endpoint_pool_is_closed_when_the_canary_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug 4 (issue 48): the pool (its health probes) is closed whatever ends the canary, not only a verdict."""
    import asyncio

    from datagen_operator.engine.client.pool import EndpointPool
    from datagen_operator.steps.canary import run_canary

    closed = 0
    close = EndpointPool.close

    async def counted(self: EndpointPool) -> None:
        nonlocal closed
        closed += 1
        await close(self)

    def broken(*_: Any, **__: Any) -> list[int]:
        raise RuntimeError("the template raised")

    monkeypatch.setattr(EndpointPool, "close", counted)
    monkeypatch.setattr(Renderer, "render", broken)
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text('{"id": "a", "messages": [{"role": "user", "content": "q"}]}\n')
    standin = ensure_standin("kimi-k2.5")
    spec = parse_spec(local_spec(standin, dataset, tmp_path / "out"))
    tokenizer = load_tokenizer(standin, trust_remote_code=False)
    with pytest.raises(RuntimeError, match="the template raised"):
        asyncio.run(run_canary(spec, tokenizer, dataset, ["http://127.0.0.1:9"]))
    assert closed == 1
