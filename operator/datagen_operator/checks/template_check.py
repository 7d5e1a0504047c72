"""The template verdict: do the rendered prompts ask for what the run wants (thinking on or off, the opener
prefilled where the preset's template prefills it)?

Checked on the prompts before any output is judged, so when the chat template is the cause it is named
first: a template that drops the `<think>` prefill still gets reasoning from a model that opens `<think>`
itself, and every output check passes while the prompts differ from what the model was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.status import CheckResult
from datagen_operator.checks.record_checks import Expectations, prompt_closes_think, prompt_opens_think

CHAT_TEMPLATE = "chat_template"
LINES_NAMED = 3
"""Lines named in a verdict whose cause is their own chat_template_kwargs; the rest are counted."""


@dataclass(frozen=True)
class TemplateExpectation:
    """What the preset's own template renders at the end of a generation prompt."""

    model_label: str
    think_start: str | None
    think_end: str | None
    switch: str | None
    """The template variable that turns thinking on or off (None: the template cannot switch)."""


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt and, for a dataset line with its own chat_template_kwargs, what it asked for."""

    input_ids: Sequence[int]
    line: str | None = None
    """The line as a person finds it ("line 3 (id 'q02')"); None: a built-in probe."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The line's own chat_template_kwargs, rendered over the run's variables."""
    switch: tuple[str, bool] | None = None
    """The thinking switch among them (prompts/render.py `line_switch`): the prompt is judged by it."""


def judge_template(prompts: Sequence[RenderedPrompt], expect: Expectations, want: TemplateExpectation) -> CheckResult:
    """One verdict over the rendered prompts: passes when every prompt ends as the preset's template ends it
    for that prompt's thinking: the run's, or its line's own switch (the rule the workers and verify judge
    records by, Expectations.for_line). Prompts whose line carries its own chat_template_kwargs are judged
    apart: when they are the ones at fault, the verdict names those lines and their keys, not
    generation.thinking."""
    n = len(prompts)
    if not expect.think_start_ids or expect.think_end_id is None or n == 0:
        return CheckResult(name=CHAT_TEMPLATE, passed=True, total=n, verdict="no think block to check in the prompts")
    block = f"`{want.think_start}{want.think_end}`"
    switch = f"the template variable `{want.switch}`" if want.switch else "its thinking switch"
    closed_on: list[RenderedPrompt] = []
    """Thinking on for the prompt, and it ends with an empty think block."""
    open_off: list[RenderedPrompt] = []
    """Thinking off for the prompt, and it does not close the think block."""
    no_opener = 0
    opened = 0
    for prompt in prompts:
        thinking = expect.thinking if prompt.switch is None else prompt.switch[1]
        opens = prompt_opens_think(prompt.input_ids, expect)
        closes = prompt_closes_think(prompt.input_ids, expect)
        opened += opens
        if thinking and closes:
            closed_on.append(prompt)
        elif thinking and expect.prompt_prefills_opener and not opens:
            no_opener += 1
        elif not thinking and not closes:
            open_off.append(prompt)
    problems: list[str] = []
    run_closed, line_closed = _by_cause(closed_on)
    run_open, line_open = _by_cause(open_off)
    if run_closed:
        problems.append(
            f"{len(run_closed)}/{n} rendered prompts end with an empty think block {block}: the chat template "
            f"rendered thinking OFF in a thinking run; set generation.thinking: true and check {switch}"
        )
    if no_opener:
        problems.append(
            f"{no_opener}/{n} rendered prompts do not end with `{want.think_start}` although {want.model_label}'s "
            "chat template prefills it: model.path's template is not this preset's (another model's, or an older "
            "revision's); use the model's own template or the matching preset"
        )
    if run_open:
        problems.append(
            f"{len(run_open)}/{n} rendered prompts do not close the think block ({block}) although thinking is off: "
            f"the chat template ignored {switch}; check the template or set generation.thinking: true"
        )
    problems += _line_problems(line_closed, "on", n, block, want)
    problems += _line_problems(line_open, "off", n, block, want)
    if problems:
        bad = len(closed_on) + no_opener + len(open_off)
        return CheckResult(name=CHAT_TEMPLATE, passed=False, count=bad, total=n, verdict="; ".join(problems))
    own = [p.switch[1] for p in prompts if p.switch is not None and p.switch[1] != expect.thinking]
    run_shape = "thinking on" + (f", `{want.think_start}` prefilled" if opened else "") if expect.thinking else ""
    shape = run_shape or "thinking off"
    if own:
        shape += f"; {len(own)} thinking {'on' if own[0] else 'off'} by their line's own switch"
    return CheckResult(
        name=CHAT_TEMPLATE,
        passed=True,
        total=n,
        verdict=f"{n}/{n} rendered prompts end as the template should ({shape})",
    )


def _by_cause(failed: list[RenderedPrompt]) -> tuple[list[RenderedPrompt], list[RenderedPrompt]]:
    """The prompts at fault the run's own settings explain, and those their line's own kwargs explain: a line's
    switch always; a line's other keys only where no prompt without kwargs (a probe, a plain line) fails the same
    way, else the template fails the run's prompts too and the line's keys are no cause."""
    run = [p for p in failed if not p.kwargs]
    others = [p for p in failed if p.kwargs and p.switch is None]
    if run:
        return run + others, [p for p in failed if p.switch is not None]
    return [], [p for p in failed if p.kwargs]


def _line_problems(
    prompts: list[RenderedPrompt], wanted: str, n: int, block: str, want: TemplateExpectation
) -> list[str]:
    """The verdicts on prompts at fault whose line carries its own chat_template_kwargs, each line named with
    its keys: where the line sets the template's switch itself, the template did not follow it; where it sets
    other keys only, one of them moved the think block away from what the run asks (`wanted`)."""
    rendered = f"end with an empty think block {block}" if wanted == "on" else f"do not close the think block ({block})"
    problems = []
    switched = [p for p in prompts if p.switch is not None]
    if switched:
        names = sorted({f"`{p.switch[0]}: {json.dumps(p.switch[1])}`" for p in switched if p.switch is not None})
        problems.append(
            f"{len(switched)}/{n} rendered prompts {rendered} although their dataset line turns thinking {wanted} "
            f"itself ({_lines(switched)}): the chat template does not follow the line's {' / '.join(names)}; "
            "remove that key from those lines (generation.thinking decides them then) or use a template that reads it"
        )
    others = [p for p in prompts if p.switch is None]
    if others:
        where = f"the template's switch `{want.switch}`" if want.switch else "the template's thinking switch"
        problems.append(
            f"{len(others)}/{n} rendered prompts {rendered} although the run asks thinking {wanted}, and each comes "
            f"from a dataset line with its own chat_template_kwargs ({_lines(others)}): a key of those lines "
            f"switches the template's thinking, which generation.thinking does not override; set {where} in those "
            "lines to the thinking you want, or remove the key"
        )
    return problems


def _lines(prompts: list[RenderedPrompt]) -> str:
    shown = ", ".join(f"{p.line}: chat_template_kwargs {_kwargs(p.kwargs)}" for p in prompts[:LINES_NAMED])
    return shown + (f" and {len(prompts) - LINES_NAMED} more" if len(prompts) > LINES_NAMED else "")


def _kwargs(kwargs: Mapping[str, Any]) -> str:
    text = json.dumps(dict(kwargs), sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
