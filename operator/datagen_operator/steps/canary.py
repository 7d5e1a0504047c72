"""The canary: before any bulk record, a few real prompts (and built-in probes) go through /generate as
token ids and must pass every raw-token check. One implementation for the operator (as a Job) and the
local runner (in process)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.api.commands import CanaryCommand
from datagen_operator.api.flags import NO_THINK_END, ends_truncated, finish_type
from datagen_operator.api.generation_spec import HistoryReasoning, TemplateVariableMix
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.api.step_program import add_shared_arguments, write_verdict
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.canary_judgment import (
    CanaryRecord,
    SetAside,
    ThinkingControl,
    judge_canary,
    judge_thinking_control,
    markers_seen,
    opened_but_never_closed,
    second_samples,
    vocabulary_families,
    with_batch_fill,
    without_stale_batch_fill,
)
from datagen_operator.checks.evaluate import CheckContext, check_context
from datagen_operator.checks.samples import compared_samples
from datagen_operator.checks.server_truth import model_label
from datagen_operator.checks.template_check import RenderedPrompt, TemplateExpectation, judge_template
from datagen_operator.engine.limits import batch_limits
from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from datagen_operator.engine.requests import generate_body, run_sampling
from datagen_operator.prompts.dataset_ref import DatasetRef  # light: the reader itself is imported where used

if TYPE_CHECKING:  # the reader itself is imported where it is used (the canary's start-up stays light)
    from datagen_operator.prompts.conversation import AnswerSplit, AnswerSplitter
    from datagen_operator.prompts.render import Renderer

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
    from datagen_operator.prompts.lines import MalformedLine, line_number, prompt_from
    from datagen_operator.prompts.scan import ShardScan

    yield from (dict(p) for p in PROBES)
    draws = variable_draws(mix)
    # Streamed: the dataset is read only as far as the prompts the canary draws (a plan would read it whole).
    for item in ShardScan(dataset, 0, 1):
        if isinstance(item, MalformedLine):
            continue
        prompt = prompt_from(*item, draws)
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
    from datagen_operator.engine.client.policy import RetryPolicy
    from datagen_operator.engine.client.pool import EndpointPool
    from datagen_operator.engine.client.reads import make_session
    from datagen_operator.prompts.pin import render_date
    from datagen_operator.prompts.render import Renderer, template_variables

    resolved = resolve_model(spec)
    config_dir = model_dir or model_config_dir(spec.model.path, spec.model.tokenizer_dir)
    expect = rc.expectations_for(resolved, tokenizer, read_model_eos_ids(config_dir))
    # The canary's records sit in the output: its prompts render on the output's pinned date, as the workers'.
    renderer = Renderer(
        tokenizer, template_variables(resolved, render_date(record_file.parent) if record_file else None)
    )
    wanted = spec.checks.canary_prompts + len(PROBES)
    prompts = iter_canary_prompts(
        DatasetRef.of(spec.dataset, dataset), spec.generation.turns,
        history_reasoning=spec.generation.history_reasoning, mix=spec.generation.template_variable_mix,
    )  # fmt: skip
    session = make_session(wanted, len(servers))
    pool: EndpointPool | None = None
    try:
        pool = EndpointPool(servers, session, unreachable_after_s=spec.clients.request_timeout)
        client = GenerateClient(
            pool, policy=RetryPolicy(max_attempts=3), request_timeout_s=spec.clients.request_timeout, stream=False
        )
        ctx = check_context(resolved, spec.checks, expect.think_end_id)
        run = _CanaryRun(spec, resolved, expect, ctx, renderer, client)
        await run.draw(prompts, wanted)
        await run.uncap()
        first = await run.first_verdicts(tokenizer)
        limits = [batch_limits(info) for info in await asyncio.gather(*(_server_info(session, u) for u in servers))]
    finally:  # whatever ends the canary: the pool's health probes stop, the connections close
        if pool is not None:
            await pool.close()
        await session.close()
    if record_file is not None:
        await asyncio.to_thread(_write_records, record_file, run.records, run.set_aside)
    outcome = judge_canary(
        run.records, run.ctx, capped=run.capped, first=tuple(first), set_aside=tuple(run.set_aside),
        samples=run.samples,
    )  # fmt: skip
    return with_batch_fill(outcome, spec, limits, run.records)


class _CanaryRun:
    """One canary's requests and what they gathered: the prompts sent with their records, those set aside."""

    def __init__(
        self, spec: DataGenRunSpec, resolved: ResolvedModel, expect: rc.Expectations, ctx: CheckContext,
        renderer: Renderer, client: Any,
    ) -> None:  # fmt: skip
        self.spec, self.resolved, self.expect, self.ctx, self.renderer = spec, resolved, expect, ctx, renderer
        self.client = client
        """The GenerateClient the requests go through."""
        run_budget = spec.generation.sampling.max_new_tokens
        cap = min(spec.checks.canary_max_new_tokens, run_budget)
        self.full_params = run_sampling(spec.generation.sampling, expect.stop_token_ids)
        self.capped_params = {**self.full_params, "max_new_tokens": cap}
        self.capped = cap < run_budget
        """Whether the records were asked at the canary's cap, below the run's max_new_tokens."""
        self.sent: list[tuple[dict[str, Any], list[int]]] = []
        self.records: list[CanaryRecord] = []
        self.set_aside: list[SetAside] = []
        self.samples: Counts | None = None

    @property
    def params(self) -> dict[str, Any]:
        """The sampling the records were asked with (the cap's until they were asked again uncapped)."""
        return self.capped_params if self.capped else self.full_params

    async def send(
        self, prompt: dict[str, Any], input_ids: list[int], params: dict[str, Any], sample: int = 0
    ) -> CanaryRecord | None:
        """One request, its reply a record; a refusal sets the prompt aside (None)."""
        from datagen_operator.engine.client.policy import Rejected
        from datagen_operator.prompts.render import line_thinking

        try:
            reply = await self.client.generate(generate_body(input_ids, params, sample=sample))
        except Rejected as refusal:
            self.set_aside.append(SetAside(prompt["id"], f"refused by the server: HTTP {refusal.status} {refusal}"))
            return None
        line = prompt.get("variables")
        asked = replace(self.expect, max_new_tokens=params["max_new_tokens"])  # a capped request is cut at its cap
        return _record(prompt, input_ids, reply, asked.for_line(line_thinking(self.resolved, line) if line else None))

    async def draw(self, prompts: Iterator[dict[str, Any]], wanted: int) -> None:
        """Prompts drawn, rendered and sent at the cap, a batch at a time, until `wanted` records or no prompt
        is left: one the template cannot render or the server refuses is set aside and the next drawn."""
        from datagen_operator.prompts.lean_render import RenderError

        exhausted = False
        while len(self.records) < wanted and not exhausted:
            batch: list[tuple[dict[str, Any], list[int]]] = []
            while len(self.records) + len(batch) < wanted:
                prompt = next(prompts, None)
                if prompt is None:
                    exhausted = True
                    break
                try:
                    ids = self.renderer.render(prompt["messages"], prompt.get("tools"), prompt.get("variables"))
                    batch.append((prompt, ids))
                except RenderError as error:
                    self.set_aside.append(SetAside(prompt["id"], str(error)))
            results = await asyncio.gather(*(self.send(p, ids, self.capped_params) for p, ids in batch))
            self.records += [r for r in results if r is not None]
            self.sent += [item for item, r in zip(batch, results, strict=True) if r is not None]

    async def uncap(self) -> None:
        """Every output cut by the canary's cap before any reasoning closed: those cut asked again with the run's
        own budget."""
        if not (self.capped and _inconclusive(self.records, self.ctx)):
            return
        sent, records = self.sent, self.records
        again = [(i, p, ids) for i, ((p, ids), r) in enumerate(zip(sent, records, strict=True)) if _cut(r)]
        redone = await asyncio.gather(*(self.send(p, ids, self.full_params) for _, p, ids in again))
        for (index, _, _), record in zip(again, redone, strict=True):
            if record is not None:
                records[index] = record
        self.capped = False

    async def first_verdicts(self, tokenizer: Any) -> list[CheckResult]:
        """The verdicts on causes upstream of the outputs (the template, the model's thinking, with turns all the
        history), asking what they need; each prompt's second sample asked where samples are compared."""
        spec, resolved, expect, records = self.spec, self.resolved, self.expect, self.records
        # Each prompt judged by its own thinking, its line's switch where it sets one (as its record is).
        judged = [
            rendered_prompt(prompt, record.input_ids, resolved)
            for (prompt, _), record in zip(self.sent, records, strict=True)
        ]
        first = [judge_template(judged, expect, _template_expectation(resolved, spec))]
        # Another family's markers explain missing ones (reasoning_captured names them): no control is needed.
        seen = markers_seen(records, expect, vocabulary_families(tokenizer))
        self.ctx = replace(self.ctx, markers_seen=seen)
        if seen is None and _never_closed(records, expect):
            control = await _thinking_control(records, expect, self.send, self.params)
            first.append(judge_thinking_control(control, self.ctx, model_label(spec)))
        elif seen is None and any(NO_THINK_END in r.flags for r in records):
            first.append(opened_but_never_closed(self.ctx, model_label(spec)))
        if compared_samples(spec):
            seconds = await asyncio.gather(*(self.send(p, ids, self.params, sample=1) for p, ids in self.sent))
            self.samples = second_samples(records, list(seconds))
        if spec.generation.turns == "all":
            history_reasoning = spec.generation.history_reasoning
            first.append(
                await history_probe(self.sent, records, self.renderer, resolved, self.send, self.full_params,
                                    history_reasoning)
            )  # fmt: skip
        return first


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
    from datagen_operator.prompts.conversation import AnswerSplitter, Turns, turn_messages

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
    found = _answer_to_continue(sent, records, splitter)
    if found is None:
        return CheckResult(
            name=HISTORY, passed=False, count=1, total=1,
            verdict="no canary answer finished with a stop, so no second turn could be built on one: the history of "
            "later turns is unproven",
        )  # fmt: skip
    prompt, split = found
    variables = prompt.get("variables")
    # Built as the workers build turn 2 (the run's historyReasoning included).
    asked = Turns((tuple(prompt["messages"]), ({"role": "user", "content": FOLLOW_UP},)))
    messages = turn_messages(asked, 1, [split], history_reasoning=history_reasoning)
    turn_two = renderer.render(messages, prompt.get("tools"), variables)
    shown = renderer.tokenizer.decode(turn_two, skip_special_tokens=False)
    problems = _history_problems(resolved, split, shown)
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


def _answer_to_continue(
    sent: list[tuple[dict[str, Any], list[int]]], records: list[CanaryRecord], splitter: AnswerSplitter
) -> tuple[dict[str, Any], AnswerSplit] | None:
    """A canary answer that finished with a stop, split as SGLang's chat endpoint splits it, with its prompt. An
    answer that calls a tool ends its conversation (no turn follows it): one that does not where there is one."""
    from datagen_operator.prompts.conversation import calls_tool, finished_with_stop

    finished = [
        (prompt, splitter.split(record.output_ids, record.finish_reason, record.has_tools, prompt.get("variables"),
                                prompt.get("tools") or ()))
        for (prompt, _), record in zip(sent, records, strict=False)
        if finished_with_stop(record.finish_reason) and prompt["messages"]
    ]  # fmt: skip
    return next((item for item in finished if not calls_tool(item[1])), finished[0] if finished else None)


def _history_problems(resolved: ResolvedModel, split: AnswerSplit, shown: str) -> list[str]:
    """What is wrong with turn 1's answer as turn 2's history: a think marker left in its content by the
    reasoning parser, or the answer missing from turn 2's prompt as the template rendered it (`shown`)."""
    problems = [
        f"turn 1's answer, split by the reasoning parser {resolved.reasoning_parser}, holds {marker} in its content: "
        "the next turn's history would carry reasoning as the answer"
        for marker in (resolved.think_start, resolved.think_end)
        if marker and marker in split.content
    ]
    answer = split.content.strip()
    if answer and answer not in shown:
        problems.append(
            f"turn 2's prompt does not hold turn 1's answer ({answer[:60]!r}): the chat template drops or rewrites "
            "earlier assistant turns, so every later turn would be generated on a history the model never wrote"
        )
    return problems


def _cut(record: CanaryRecord) -> bool:
    return ends_truncated(finish_type(record.finish_reason))


def _inconclusive(records: list[CanaryRecord], ctx: CheckContext) -> bool:
    """A thinking run where no output reached the think end and some were cut by the canary's cap."""
    if not ctx.thinking or ctx.think_end_id is None:
        return False
    return not any(ctx.think_end_id in r.output_ids for r in records) and any(_cut(r) for r in records)


def _never_closed(records: list[CanaryRecord], expect: rc.Expectations) -> bool:
    """Outputs lack the closer while the prompt prefilled the opener: the one case raw tags cannot explain."""
    return any(NO_THINK_END in r.flags and rc.prompt_opens_think(r.input_ids, expect) for r in records)


async def _thinking_control(
    records: list[CanaryRecord], expect: rc.Expectations, send: Any, params: dict[str, Any], limit: int = 8
) -> ThinkingControl:
    """Send up to `limit` never-closed prompts again with the think block closed by hand, and compare each
    output's length with its own prompt's."""
    open_records = [r for r in records if NO_THINK_END in r.flags and rc.prompt_opens_think(r.input_ids, expect)]
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
    from datagen_operator.output.canary_verdict import canary_basis_here, remember_canary, remembered_canary
    from datagen_operator.prompts.render import load_tokenizer

    spec = load_run(args.run).spec
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(args.tokenizer or spec.model.tokenizer_dir, trust_remote_code=resolved.trust_remote_code)
    # One rule with `datagen run` (api/canary_reuse.py): a pass kept in the output for the same basis stands.
    output = Path(args.output) if args.output else None
    basis = canary_basis_here(spec, Path(args.tokenizer or spec.model.tokenizer_dir), tokenizer)
    if output is not None and (remembered := remembered_canary(output, basis)) is not None:
        return write_verdict(without_stale_batch_fill(remembered, spec), args.termination_log)
    outcome = asyncio.run(
        run_canary(
            spec,
            tokenizer,
            Path(args.dataset or spec.dataset.path),
            args.server,
            Path(args.records) if args.records else None,
        )
    )
    if output is not None and outcome.passed:
        remember_canary(output, basis, outcome)
    code = write_verdict(outcome, args.termination_log)
    if not outcome.passed and spec.checks.on_failure == "Halt" and args.lease_holder and args.output:
        # The run halts here, before any bulk record: nothing more is written to its output, so another run
        # may take it now rather than when the preflight's lease lapses (its startup budget plus 30 minutes).
        from datagen_operator.output.lease import Holder, release_lease

        release_lease(Path(args.output), Holder.parse(args.lease_holder, args.lease_holder))
    return code
