"""The template verdict: do the rendered prompts ask for what the run wants (thinking on or off, the opener
prefilled where the preset's template prefills it)?

Checked on the prompts before any output is judged, so when the chat template is the cause it is named
first: a template that drops the `<think>` prefill still gets reasoning from a model that opens `<think>`
itself, and every output check passes while the prompts differ from what the model was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from datagen_operator.api.status import CheckResult
from datagen_operator.checks.record_checks import Expectations, prompt_closes_think, prompt_opens_think

CHAT_TEMPLATE = "chat_template"


@dataclass(frozen=True)
class TemplateExpectation:
    """What the preset's own template renders at the end of a generation prompt."""

    model_label: str
    think_start: str | None
    think_end: str | None
    switch: str | None
    """The template variable that turns thinking on or off (None: the template cannot switch)."""


def judge_template(prompts: Sequence[Sequence[int]], expect: Expectations, want: TemplateExpectation) -> CheckResult:
    """One verdict over the rendered prompts: passes when every prompt ends as the preset's template ends it."""
    n = len(prompts)
    if not expect.think_start_ids or expect.think_end_id is None or n == 0:
        return CheckResult(name=CHAT_TEMPLATE, passed=True, total=n, verdict="no think block to check in the prompts")
    opened = sum(prompt_opens_think(p, expect) for p in prompts)
    closed = sum(prompt_closes_think(p, expect) for p in prompts)
    block = f"`{want.think_start}{want.think_end}`"
    switch = f"the template variable `{want.switch}`" if want.switch else "its thinking switch"
    problem: str | None = None
    bad = 0
    if expect.thinking and closed:
        bad = closed
        problem = (
            f"{closed}/{n} rendered prompts end with an empty think block {block}: the chat template rendered "
            f"thinking OFF in a thinking run; set generation.thinking: true and check {switch}"
        )
    elif expect.thinking and expect.prompt_prefills_opener and opened < n:
        bad = n - opened
        problem = (
            f"{bad}/{n} rendered prompts do not end with `{want.think_start}` although {want.model_label}'s chat "
            "template prefills it: model.path's template is not this preset's (another model's, or an older "
            "revision's); use the model's own template or the matching preset"
        )
    elif not expect.thinking and closed < n:
        bad = n - closed
        problem = (
            f"{bad}/{n} rendered prompts do not close the think block ({block}) although thinking is off: the chat "
            f"template ignored {switch}; check the template or set generation.thinking: true"
        )
    if problem is not None:
        return CheckResult(name=CHAT_TEMPLATE, passed=False, count=bad, total=n, verdict=problem)
    shape = (
        "thinking on" + (f", `{want.think_start}` prefilled" if opened else "") if expect.thinking else "thinking off"
    )
    return CheckResult(
        name=CHAT_TEMPLATE,
        passed=True,
        total=n,
        verdict=f"{n}/{n} rendered prompts end as the template should ({shape})",
    )
