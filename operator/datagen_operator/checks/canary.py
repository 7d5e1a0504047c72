"""The canary: before any bulk record, a few real prompts (and built-in probes) go through /generate as
token ids and must pass every raw-token check. One implementation for the operator (as a Job) and the
local runner (in process)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.commands import CanaryCommand
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import (
    AUTO_CONCURRENCY,
    DataGenRunSpec,
    HistoryReasoning,
    TemplateVariableMix,
)
from datagen_operator.api.status import CheckResult
from datagen_operator.api.step_program import add_shared_arguments, write_verdict
from datagen_operator.api.words import plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.batch_fill import (
    BATCH_FULL,
    auto_concurrency,
    judge_batch_fill,
    suggested_concurrency,
    underfilled,
)
from datagen_operator.checks.evaluate import CheckContext, MarkersSeen, check_context, evaluate
from datagen_operator.checks.samples import SampleComparison, compared_samples
from datagen_operator.checks.server_truth import model_label
from datagen_operator.checks.template_check import RenderedPrompt, TemplateExpectation, judge_template
from datagen_operator.engine.limits import BatchLimits, batch_limits
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.engine.requests import generate_body, run_sampling
from datagen_operator.presets.think_markers import MarkersWritten
from datagen_operator.prompts.dataset_ref import DatasetRef  # the reader itself is imported where it is used
from datagen_operator.tokenizer.families import FAMILIES

MODEL_THINKING = "model_thinking"

# Built-in probes: a reasoning question, a tool call and a multi-turn conversation, whatever the dataset holds.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PROBES: tuple[dict[str, Any], ...] = (
    {"id": "probe:reasoning", "messages": [{"role": "user", "content": "Is 221 prime? Show your reasoning briefly."}]},
    {
        "id": "probe:tools",
        "messages": [{"role": "user", "content": "What is the weather in Lisbon right now?"}],
        "tools": [WEATHER_TOOL],
    },
    {
        "id": "probe:multi-turn",
        "messages": [
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "And the next one after it?"},
        ],
    },
)


@dataclass(frozen=True)
class CanaryRecord:
    id: str
    input_ids: list[int]
    output_ids: list[int]
    finish_reason: Any
    completion_tokens: int | None
    has_tools: bool
    flags: frozenset[str]

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "flags": sorted(self.flags)}


@dataclass(frozen=True)
class SetAside:
    """A prompt the canary could not use (the template cannot render it, or the server refused it)."""

    id: str
    reason: str


IGNORES_THINKING_RATIO = 1.8
"""Outputs with the think block open less than this much longer than with it closed: no reasoning happened.
(Reasoning models write several times their answer's length; one model's two answers vary by far less.)"""


@dataclass(frozen=True)
class ThinkingControl:
    """For each output that never closed its reasoning: its length over the length of the same prompt's
    output with the think block closed by hand (the model told not to think)."""

    length_ratios: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """The median ratio: one unusually long or short answer does not decide the verdict."""
        return statistics.median(self.length_ratios) if self.length_ratios else 1.0


def judge_thinking_control(control: ThinkingControl, ctx: CheckContext, model_label: str) -> CheckResult:
    """Tell "never closes its reasoning" from "does not reason at all" when the template prefills the opener
    (then neither writes the opener, and both lack the closer)."""
    ratio = control.ratio
    end = f"`{ctx.think_end}` ({ctx.think_end_id})"
    if ratio < IGNORES_THINKING_RATIO:
        verdict = (
            f"{model_label} ignores thinking: outputs are about as long with the think block open as with it closed "
            f"(x{ratio:.1f}) and none writes {end}; the weights at model.path are not a thinking model (an "
            "instruct model under a thinking preset?); check model.path and model.preset"
        )
    else:
        verdict = (
            f"{model_label} reasons but never closes its reasoning: outputs are x{ratio:.1f} longer with the think "
            f"block open than closed, and none writes {end}; the model's think end differs from the preset's (check "
            "model.preset or model.thinkTokens against the model's tokenizer)"
        )
    return CheckResult(name=MODEL_THINKING, passed=False, total=1, verdict=verdict)


def opened_but_never_closed(ctx: CheckContext, model_label: str) -> CheckResult:
    """The model wrote the opener itself and no closer: it reasons, and never ends its reasoning."""
    verdict = (
        f"{model_label} opens `{ctx.think_start}` but never closes its reasoning: no output writes `{ctx.think_end}` "
        f"({ctx.think_end_id}); the model's think end differs from the preset's (check model.preset or "
        "model.thinkTokens against the model's tokenizer)"
    )
    return CheckResult(name=MODEL_THINKING, passed=False, total=1, verdict=verdict)


def judge_canary(
    records: list[CanaryRecord],
    ctx: CheckContext,
    capped: bool,
    first: tuple[CheckResult, ...] = (),
    set_aside: tuple[SetAside, ...] = (),
    samples: Counts | None = None,
) -> StepOutcome:
    """Every raw-token check must pass on every canary record (no thresholds: the canary is small).

    `first` holds verdicts on causes upstream of the outputs (the template, the model's thinking): they come
    first in the message, so the true cause is read first. Truncation is forgiven when the canary capped
    max_new_tokens below the run's, but at least one output must reach the think end in a thinking run, or
    the canary proves nothing. `samples`: the prompts whose second sample was compared with the first
    (checks.samples), judged by the run's own threshold.
    """
    if not records:
        why = f"; set aside: {_describe_set_aside(set_aside)}" if set_aside else " (empty dataset?)"
        return StepOutcome(False, Reason.NO_PROMPTS, f"the canary had no prompt it could send{why}")
    counts = Counts()
    for record in records:
        counts.add(len(record.input_ids), len(record.output_ids), 0, record.flags, record.has_tools)
    if samples is not None:
        counts.merge(samples)
    strict = ctx.thresholds.model_copy(
        update={
            "min_reasoning_rate": 1.0,
            "max_token_mismatch_rate": 0.0,
            "max_error_rate": 0.0,
            "max_truncation_rate": 1.0 if capped else ctx.thresholds.max_truncation_rate,
        }
    )
    strict_ctx = replace(ctx, thresholds=strict)
    checks = [*first, *evaluate(counts, strict_ctx)]
    reached = sum(1 for r in records if ctx.think_end_id is not None and ctx.think_end_id in r.output_ids)
    if ctx.thinking and ctx.think_end_id is not None and reached == 0 and all(c.passed for c in checks):
        checks.append(
            CheckResult(
                name="canary_conclusive",
                passed=False,
                total=len(records),
                verdict=f"no output reached `{ctx.think_end}` even with the run's max_new_tokens; raise "
                "generation.sampling.max_new_tokens so a whole reasoning block fits",
            )
        )
    failed = [c for c in checks if not c.passed]
    n = len(records)
    aside = f"; set aside {_describe_set_aside(set_aside)}" if set_aside else ""
    if failed:
        return StepOutcome(False, Reason.FAILED, "; ".join(c.verdict for c in failed) + aside, tuple(checks))
    what = "reasoning closed, " if ctx.thinking and ctx.think_end_id is not None else ""  # only ids can tell
    message = f"{n}/{n} canary outputs pass ({what}token counts, termination){aside}"
    return StepOutcome(True, Reason.PASSED, message, tuple(checks))


def with_batch_fill(
    outcome: StepOutcome, spec: DataGenRunSpec, servers: list[BatchLimits | None], records: list[CanaryRecord]
) -> StepOutcome:
    """A passed canary also says whether shards x clients.concurrency can keep the servers' batches full, sizing
    requests as the canary's were: a warning in its message (CanaryPassed's, `datagen run`'s line) and the
    batch_full check in its verdict; the canary still passes (the data is as faithful, only the GPUs idle).
    With `clients.concurrency: auto` it sizes the number itself, by the same rule, and records it in its verdict
    (`concurrency`) and its message: the workers send at it."""
    if not outcome.passed or not records:
        return outcome
    tokens = sum(len(r.input_ids) + len(r.output_ids) for r in records) / len(records)
    shards = spec.clients.shards
    if spec.clients.concurrency == AUTO_CONCURRENCY:
        auto = auto_concurrency(shards, servers, tokens)
        outcome = replace(outcome, message=f"{outcome.message}; {auto.said}", concurrency=auto.concurrency)
    check = judge_batch_fill(shards, spec.clients.per_shard(outcome.concurrency), servers, tokens)
    if check is None:
        return outcome
    if not underfilled(check):
        return replace(outcome, checks=(*outcome.checks, check))
    return replace(outcome, message=f"{outcome.message}; warning: {check.verdict}", checks=(*outcome.checks, check))


def without_stale_batch_fill(outcome: StepOutcome, spec: DataGenRunSpec) -> StepOutcome:
    """A remembered verdict for a resume. Its batch_full check holds for the requests in flight it was judged at:
    once clients.shards x clients.concurrency changed (a resume after following its advice), it and its warning
    go. With `clients.concurrency: auto` the verdict's own number stands (the same servers, the same batches);
    a verdict judged at a fixed number before the spec said auto gets one from its check's batch slots."""
    check = next((c for c in outcome.checks if c.name == BATCH_FULL), None)
    shards = spec.clients.shards
    if spec.clients.concurrency != AUTO_CONCURRENCY:
        outcome = replace(outcome, concurrency=None)
    elif outcome.concurrency is None and check is not None:
        outcome = replace(outcome, concurrency=suggested_concurrency(check.total, shards))
    if check is None or check.count == shards * spec.clients.per_shard(outcome.concurrency):
        return outcome
    message = outcome.message.removesuffix(f"; warning: {check.verdict}")
    return replace(outcome, message=message, checks=tuple(c for c in outcome.checks if c is not check))


def markers_seen(records: list[CanaryRecord], expect: rc.Expectations, families: tuple[str, ...]) -> MarkersSeen | None:
    """Another family's think markers in the outputs (the pair most outputs hold), None when none holds any."""
    written = [found for r in records if (found := rc.other_markers_in(r.output_ids, expect)) is not None]
    if not written:
        return None
    markers, outputs = Counter(found.markers for found in written).most_common(1)[0]
    opener = any(found.opener_written for found in written if found.markers == markers)
    return MarkersSeen(MarkersWritten(markers, opener), outputs, families)


def vocabulary_families(tokenizer: Any) -> tuple[str, ...]:
    """The families whose marker tokens the tokenizer holds: the model's own family, whatever the preset says
    (the Qwen3 hybrid and Qwen3-2507 share one vocabulary, so both are named)."""
    get_added_vocab = getattr(tokenizer, "get_added_vocab", None)
    added = get_added_vocab() if callable(get_added_vocab) else {}
    markers = {name: family.chat.vocabulary_markers for name, family in FAMILIES.items()}
    return tuple(name for name, needed in markers.items() if needed and all(token in added for token in needed))


def _describe_set_aside(set_aside: tuple[SetAside, ...], limit: int = 3) -> str:
    shown = ", ".join(f"{s.id} ({s.reason[:120]})" for s in set_aside[:limit])
    more = f" and {len(set_aside) - limit} more" if len(set_aside) > limit else ""
    return f"{plural(len(set_aside), 'prompt')}: {shown}{more}"


def iter_canary_prompts(
    dataset: DatasetRef,
    turns: str = "last",
    *,
    history_reasoning: HistoryReasoning,
    mix: TemplateVariableMix | None = None,
) -> Iterator[dict[str, Any]]:
    """The built-in probes, then the dataset's valid prompts in dataset order (drawn as needed), each as the
    workers send its first request (prompts/conversation.py `request_messages`): of dataset.sample's subset, with
    generation.templateVariableMix's draws, as the workers read them."""
    from datagen_operator.prompts.conversation import plan_turns, request_messages
    from datagen_operator.prompts.draws import variable_draws
    from datagen_operator.prompts.lines import line_number
    from datagen_operator.prompts.plan import plan_shard

    yield from (dict(p) for p in PROBES)
    plan = plan_shard(dataset, 0, 1, draws=variable_draws(mix))
    for prompt in plan.iter_prompts():
        if turns == "all" and not len(plan_turns(prompt.messages)):
            continue  # no user turn: the workers set it aside
        messages = request_messages(prompt.messages, turns, history_reasoning=history_reasoning)
        yield {
            "id": prompt.id, "line": line_number(prompt.position), "messages": messages, "tools": prompt.tools,
            "variables": prompt.variables,
        }  # fmt: skip


def rendered_prompt(prompt: dict[str, Any], input_ids: list[int], resolved: ResolvedModel) -> RenderedPrompt:
    """A canary prompt as the template check judges it: by its line's own switch, the line named."""
    from datagen_operator.prompts.render import line_switch

    kwargs = prompt.get("variables") or {}
    line = prompt.get("line")
    where = f"line {line} (id {prompt['id']!r})" if line is not None else repr(prompt["id"])
    return RenderedPrompt(input_ids, where, kwargs, line_switch(resolved, kwargs))


def _record(prompt: dict[str, Any], input_ids: list[int], reply: Any, expect: rc.Expectations) -> CanaryRecord:
    meta = reply.meta_info
    has_tools = bool(prompt.get("tools"))
    flags = rc.inspect_record(
        input_ids, reply.output_ids, meta.get("finish_reason"), meta.get("completion_tokens"), has_tools, expect,
        meta.get("num_retractions"),
    )  # fmt: skip
    return CanaryRecord(
        prompt["id"], input_ids, list(reply.output_ids), meta.get("finish_reason"), meta.get("completion_tokens"),
        has_tools, flags,
    )  # fmt: skip


async def run_canary(
    spec: DataGenRunSpec,
    tokenizer: Any,
    dataset: Path,
    servers: list[str],
    record_file: Path | None = None,
    model_dir: Path | None = None,
) -> StepOutcome:
    """Render, send, inspect, judge. Writes the canary records (not training data) to `record_file`.

    A prompt the template cannot render or the server refuses is set aside (named in the verdict) and the
    next one is drawn; outputs cut by the canary's cap before any reasoning closed are sent again with the
    run's budget, so a long reasoner is never judged on a cut answer.
    """
    from datagen_operator.engine.client.generate import GenerateClient
    from datagen_operator.engine.client.policy import Rejected, RetryPolicy
    from datagen_operator.engine.client.pool import EndpointPool
    from datagen_operator.engine.client.reads import make_session
    from datagen_operator.prompts.lean_render import RenderError
    from datagen_operator.prompts.pin import render_date
    from datagen_operator.prompts.render import Renderer, line_thinking, template_variables

    resolved = resolve_model(spec)
    expect = rc.expectations_for(
        resolved, tokenizer, model_dir or model_config_dir(spec.model.path, spec.model.tokenizer_dir)
    )
    ctx = check_context(resolved, spec.checks, expect.think_end_id)
    # The canary's records sit in the output: its prompts render on the output's pinned date, as the workers'.
    renderer = Renderer(
        tokenizer, template_variables(resolved, render_date(record_file.parent) if record_file else None)
    )
    wanted = spec.checks.canary_prompts + len(PROBES)
    run_budget = spec.generation.sampling.max_new_tokens
    cap = min(spec.checks.canary_max_new_tokens, run_budget)
    full_params = run_sampling(spec.generation.sampling, expect.stop_token_ids)
    capped_params = {**full_params, "max_new_tokens": cap}
    history_reasoning = spec.generation.history_reasoning
    prompts = iter_canary_prompts(
        DatasetRef.of(spec.dataset, dataset), spec.generation.turns, history_reasoning=history_reasoning,
        mix=spec.generation.template_variable_mix,
    )  # fmt: skip
    set_aside: list[SetAside] = []
    records: list[CanaryRecord] = []
    samples: Counts | None = None

    session = make_session(wanted, len(servers))
    try:
        pool = EndpointPool(servers, session, unreachable_after_s=spec.clients.request_timeout)
        client = GenerateClient(
            pool, policy=RetryPolicy(max_attempts=3), request_timeout_s=spec.clients.request_timeout, stream=False
        )

        async def one(
            prompt: dict[str, Any], input_ids: list[int], params: dict[str, Any], sample: int = 0
        ) -> CanaryRecord | None:
            try:
                reply = await client.generate(generate_body(input_ids, params, sample=sample))
            except Rejected as refusal:
                set_aside.append(SetAside(prompt["id"], f"refused by the server: HTTP {refusal.status} {refusal}"))
                return None
            line = prompt.get("variables")
            asked = replace(expect, max_new_tokens=params["max_new_tokens"])  # a capped request is cut at its cap
            return _record(prompt, input_ids, reply, asked.for_line(line_thinking(resolved, line) if line else None))

        sent: list[tuple[dict[str, Any], list[int]]] = []
        exhausted = False
        while len(records) < wanted and not exhausted:
            batch: list[tuple[dict[str, Any], list[int]]] = []
            while len(records) + len(batch) < wanted:
                prompt = next(prompts, None)
                if prompt is None:
                    exhausted = True
                    break
                try:
                    ids = renderer.render(prompt["messages"], prompt.get("tools"), prompt.get("variables"))
                    batch.append((prompt, ids))
                except RenderError as error:
                    set_aside.append(SetAside(prompt["id"], str(error)))
            results = await asyncio.gather(*(one(p, ids, capped_params) for p, ids in batch))
            records += [r for r in results if r is not None]
            sent += [item for item, r in zip(batch, results, strict=True) if r is not None]

        capped = cap < run_budget
        if capped and _inconclusive(records, ctx):
            # Every output was cut before its reasoning closed: ask again with the run's own budget.
            again = [(i, p, ids) for i, ((p, ids), r) in enumerate(zip(sent, records, strict=True)) if _cut(r)]
            redone = await asyncio.gather(*(one(p, ids, full_params) for _, p, ids in again))
            for (index, _, _), record in zip(again, redone, strict=True):
                if record is not None:
                    records[index] = record
            capped = False
        # Each prompt judged by its own thinking, its line's switch where it sets one (as its record is).
        judged = [
            rendered_prompt(prompt, record.input_ids, resolved)
            for (prompt, _), record in zip(sent, records, strict=True)
        ]
        first = [judge_template(judged, expect, _template_expectation(resolved, spec))]
        # Another family's markers explain missing ones (reasoning_captured names them): no control is needed.
        seen = markers_seen(records, expect, vocabulary_families(tokenizer))
        ctx = replace(ctx, markers_seen=seen)
        if seen is None and _never_closed(records, expect):
            first.append(
                judge_thinking_control(
                    await _thinking_control(records, expect, one, capped_params if capped else full_params),
                    ctx,
                    model_label(spec),
                )
            )
        elif seen is None and any(rc.NO_THINK_END in r.flags for r in records):
            first.append(opened_but_never_closed(ctx, model_label(spec)))
        if compared_samples(spec):
            seconds = await asyncio.gather(
                *(one(p, ids, capped_params if capped else full_params, sample=1) for p, ids in sent)
            )
            samples = second_samples(records, list(seconds))
        if spec.generation.turns == "all":
            history = await history_probe(sent, records, renderer, resolved, one, full_params, history_reasoning)
            first.append(history)
        limits = [batch_limits(info) for info in await asyncio.gather(*(_server_info(session, u) for u in servers))]
        await pool.close()
    finally:
        await session.close()
    if record_file is not None:
        await asyncio.to_thread(_write_records, record_file, records, set_aside)
    outcome = judge_canary(records, ctx, capped=capped, first=tuple(first), set_aside=tuple(set_aside), samples=samples)
    return with_batch_fill(outcome, spec, limits, records)


def second_samples(records: list[CanaryRecord], again: list[CanaryRecord | None]) -> Counts:
    """Each prompt's first sample beside its second (sent as the workers send sample 1): the identical-samples
    check's counts (checks.samples), for the prompts the server answered twice."""
    comparison = SampleComparison(2)
    for first, second in zip(records, again, strict=True):
        if second is not None:
            comparison.add(first.id, orjson.dumps(first.output_ids))
            comparison.add(second.id, orjson.dumps(second.output_ids))
    return comparison.counts()


async def _server_info(session: Any, url: str) -> dict[str, Any]:
    """A server's /server_info for its batch limits; {} when it does not answer (nothing is judged of it)."""
    from datagen_operator.engine.client.reads import fetch_server_info

    try:
        info: dict[str, Any] = await fetch_server_info(session, url)
    except Exception:  # the parser check judged reachability already: a miss here only leaves the limits unknown
        return {}
    return info


HISTORY = "conversation_history"
FOLLOW_UP = "Thank you. Now say the same in one sentence."
"""The probe's second user turn: any follow-up works, the point is what the prompt before it holds."""


async def history_probe(
    sent: list[tuple[dict[str, Any], list[int]]],
    records: list[CanaryRecord],
    renderer: Any,
    resolved: ResolvedModel,
    send: Any,
    params: dict[str, Any],
    history_reasoning: HistoryReasoning,
) -> CheckResult:
    """generation.turns all: a canary answer continued by a second user turn, as the workers build it
    (prompts/conversation.py): the answer split as SGLang's chat endpoint splits it must hold no think marker
    in its content (a parser that splits wrongly would send reasoning back as the answer), and turn 2's prompt,
    rendered by the model's template, must hold turn 1's answer (a template that drops or rewrites earlier
    assistant turns would regenerate every later turn on a history the model never wrote). Turn 2 is sent too:
    its output joins the canary's records and their checks."""
    from datagen_operator.prompts.conversation import (
        AnswerSplitter,
        Turns,
        calls_tool,
        finished_with_stop,
        turn_messages,
    )

    try:
        splitter = AnswerSplitter(
            renderer.tokenizer,
            resolved.reasoning_parser,
            renderer.chat_template,
            renderer.variables,
            resolved.tool_call_parser,
        )
    except ValueError as error:
        return CheckResult(name=HISTORY, passed=False, count=1, total=1, verdict=str(error))
    # An answer that calls a tool ends its conversation (no turn follows it): the probe continues one that does
    # not where there is one.
    finished = [
        (prompt, splitter.split(record.output_ids, record.finish_reason, record.has_tools, prompt.get("variables"),
                                prompt.get("tools") or ()))
        for (prompt, _), record in zip(sent, records, strict=False)
        if finished_with_stop(record.finish_reason) and prompt["messages"]
    ]  # fmt: skip
    found = next((item for item in finished if not calls_tool(item[1])), finished[0] if finished else None)
    if found is None:
        return CheckResult(
            name=HISTORY, passed=False, count=1, total=1,
            verdict="no canary answer finished with a stop, so no second turn could be built on one: the history of "
            "later turns is unproven",
        )  # fmt: skip
    prompt, split = found
    variables = prompt.get("variables")
    problems = [
        f"turn 1's answer, split by the reasoning parser {resolved.reasoning_parser}, holds {marker} in its content: "
        "the next turn's history would carry reasoning as the answer"
        for marker in (resolved.think_start, resolved.think_end)
        if marker and marker in split.content
    ]
    # Built as the workers build turn 2 (the run's historyReasoning included).
    asked = Turns((tuple(prompt["messages"]), ({"role": "user", "content": FOLLOW_UP},)))
    messages = turn_messages(asked, 1, [split], history_reasoning=history_reasoning)
    turn_two = renderer.render(messages, prompt.get("tools"), variables)
    shown = renderer.tokenizer.decode(turn_two, skip_special_tokens=False)
    answer = split.content.strip()
    if answer and answer not in shown:
        problems.append(
            f"turn 2's prompt does not hold turn 1's answer ({answer[:60]!r}): the chat template drops or rewrites "
            "earlier assistant turns, so every later turn would be generated on a history the model never wrote"
        )
    if problems:
        return CheckResult(name=HISTORY, passed=False, count=len(problems), total=1, verdict="; ".join(problems))
    second = await send(
        {"id": f"{prompt['id']}:turn-2", "messages": messages, "variables": variables}, turn_two, params
    )
    if second is not None:
        records.append(second)
    kept = (
        "with its reasoning"
        if split.reasoning_content and split.reasoning_content.strip() in shown
        else "as its content"
    )
    return CheckResult(
        name=HISTORY,
        passed=True,
        total=1,
        verdict=f"a second turn on {prompt['id']!r}'s answer holds that answer {kept} as the template renders it",
    )


def _cut(record: CanaryRecord) -> bool:
    return rc.finish_type(record.finish_reason) == "length"


def _inconclusive(records: list[CanaryRecord], ctx: CheckContext) -> bool:
    """A thinking run where no output reached the think end and some were cut by the canary's cap."""
    if not ctx.thinking or ctx.think_end_id is None:
        return False
    return not any(ctx.think_end_id in r.output_ids for r in records) and any(_cut(r) for r in records)


def _never_closed(records: list[CanaryRecord], expect: rc.Expectations) -> bool:
    """Outputs lack the closer while the prompt prefilled the opener: the one case raw tags cannot explain."""
    return any(rc.NO_THINK_END in r.flags and rc.prompt_opens_think(r.input_ids, expect) for r in records)


async def _thinking_control(
    records: list[CanaryRecord], expect: rc.Expectations, send: Any, params: dict[str, Any], limit: int = 8
) -> ThinkingControl:
    """Send up to `limit` never-closed prompts again with the think block closed by hand, and compare each
    output's length with its own prompt's."""
    open_records = [r for r in records if rc.NO_THINK_END in r.flags and rc.prompt_opens_think(r.input_ids, expect)]
    open_records = open_records[:limit]
    assert expect.think_end_id is not None
    closed = await asyncio.gather(
        *(
            send({"id": f"{r.id}:closed", "messages": []}, [*r.input_ids, expect.think_end_id], params)
            for r in open_records
        )
    )
    ratios = tuple(
        len(r.output_ids) / max(len(c.output_ids), 1)
        for r, c in zip(open_records, closed, strict=True)
        if c is not None
    )
    return ThinkingControl(ratios)


def _template_expectation(resolved: ResolvedModel, spec: DataGenRunSpec) -> TemplateExpectation:
    return TemplateExpectation(
        model_label=model_label(spec),
        think_start=resolved.think_start,
        think_end=resolved.think_end,
        switch=resolved.preset.thinking.switch if resolved.preset else None,
    )


def _write_records(path: Path, records: list[CanaryRecord], set_aside: list[SetAside]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [orjson.dumps(r.as_json()) for r in records]
    lines += [orjson.dumps({"id": s.id, "set_aside": s.reason}) for s in set_aside]
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def build_parser() -> argparse.ArgumentParser:
    """`datagen canary`'s arguments; what the shells pass is api/commands.py's CanaryCommand."""
    parser = argparse.ArgumentParser(prog="datagen canary", description="Run the canary against running servers.")
    add_shared_arguments(
        parser,
        CanaryCommand,
        output="the run's output directory (with --lease-holder)",
        lease_holder="the run (its UID) whose output lease is given back when a refusal halts it",
    )
    parser.add_argument("--server", action="append", required=True, help="server base URL (repeatable)")
    parser.add_argument("--records", help="where to write the canary's records (JSONL)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    from datagen_operator.api import load_run
    from datagen_operator.prompts.render import load_tokenizer

    spec = load_run(args.run).spec
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(args.tokenizer or spec.model.tokenizer_dir, trust_remote_code=resolved.trust_remote_code)
    outcome = asyncio.run(
        run_canary(
            spec,
            tokenizer,
            Path(args.dataset or spec.dataset.path),
            args.server,
            Path(args.records) if args.records else None,
        )
    )
    code = write_verdict(outcome, args.termination_log)
    if not outcome.passed and spec.checks.on_failure == "Halt" and args.lease_holder and args.output:
        # The run halts here, before any bulk record: nothing more is written to its output, so another run
        # may take it now rather than when the preflight's lease lapses (its startup budget plus 30 minutes).
        from datagen_operator.output.lease import Holder, release_lease

        release_lease(Path(args.output), Holder.parse(args.lease_holder, args.lease_holder))
    return code
