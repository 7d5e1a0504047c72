"""The canary: before any bulk record, a few real prompts (and built-in probes) go through /generate as
token ids and must pass every raw-token check. One implementation for the operator (as a Job) and the
local runner (in process)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import ChecksSpec, DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import CheckContext, Tally, evaluate
from datagen_operator.control.observed import StepOutcome

CANARY = "canary"
TERMINATION_LOG_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a container's termination message."""

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


def canary_context(resolved: ResolvedModel, expect: rc.Expectations, thresholds: ChecksSpec) -> CheckContext:
    return CheckContext(
        thinking=resolved.thinking,
        preset=resolved.preset.name if resolved.preset else None,
        think_start=resolved.think_start,
        think_end=resolved.think_end,
        think_end_id=expect.think_end_id,
        thresholds=thresholds,
    )


def judge_canary(records: list[CanaryRecord], ctx: CheckContext, capped: bool) -> StepOutcome:
    """Every raw-token check must pass on every canary record (no thresholds: the canary is small).

    Truncation is forgiven when the canary capped max_new_tokens below the run's, but at least one output
    must reach the think end in a thinking run, or the canary proves nothing.
    """
    if not records:
        return StepOutcome(False, "NoPrompts", "the canary had no prompt to send (empty dataset?)")
    counts: Counter[str] = Counter(flag for record in records for flag in record.flags)
    tally = Tally(records=len(records), tool_records=sum(r.has_tools for r in records), flags=dict(counts))
    strict = ctx.thresholds.model_copy(
        update={
            "min_reasoning_rate": 1.0,
            "max_token_mismatch_rate": 0.0,
            "max_error_rate": 0.0,
            "max_truncation_rate": 1.0 if capped else ctx.thresholds.max_truncation_rate,
        }
    )
    strict_ctx = CheckContext(**{**ctx.__dict__, "thresholds": strict})
    checks = evaluate(tally, strict_ctx)
    reached = sum(1 for r in records if ctx.think_end_id is not None and ctx.think_end_id in r.output_ids)
    if ctx.thinking and ctx.think_end_id is not None and reached == 0 and all(c.passed for c in checks):
        checks.append(
            CheckResult(
                name="canary_conclusive",
                passed=False,
                total=len(records),
                verdict=f"no output reached `{ctx.think_end}` within checks.canaryMaxNewTokens; raise it so the "
                "canary sees a whole reasoning block",
            )
        )
    failed = [c for c in checks if not c.passed]
    n = len(records)
    if failed:
        return StepOutcome(False, "Failed", "; ".join(c.verdict for c in failed), tuple(checks))
    what = "reasoning closed, " if ctx.thinking and ctx.think_end else ""
    return StepOutcome(True, "Passed", f"{n}/{n} canary outputs pass ({what}token counts, termination)", tuple(checks))


def canary_prompts(dataset: Path, dataset_format: str, count: int) -> list[dict[str, Any]]:
    """The first `count` valid dataset prompts (dataset order), then the built-in probes."""
    from datagen_operator.worker.dataset import plan_shard

    plan = plan_shard(dataset, 0, 1, dataset_format)  # type: ignore[arg-type]
    chosen = []
    for prompt in plan.iter_prompts():
        if len(chosen) >= count:
            break
        chosen.append({"id": prompt.id, "messages": prompt.messages, "tools": prompt.tools})
    return chosen + [dict(p) for p in PROBES]


async def run_canary(
    spec: DataGenRunSpec, tokenizer: Any, dataset: Path, servers: list[str], record_file: Path | None = None
) -> StepOutcome:
    """Render, send, inspect, judge. Writes the canary records (not training data) to `record_file`."""
    from datagen_operator.worker.client import EndpointPool, GenerateClient, RetryPolicy, make_session
    from datagen_operator.worker.render import Renderer, template_variables

    resolved = resolve_model(spec)
    expect = rc.expectations_for(resolved, tokenizer)
    renderer = Renderer(tokenizer, template_variables(resolved))
    prompts = canary_prompts(dataset, spec.dataset.format, spec.checks.canary_prompts)
    cap = min(spec.checks.canary_max_new_tokens, spec.generation.sampling.max_new_tokens)
    sampling = spec.generation.sampling.model_dump(exclude_none=True) | {"max_new_tokens": cap}
    rendered = [(p, renderer.render(p["messages"], p.get("tools"))) for p in prompts]

    session = make_session(len(rendered), len(servers))
    try:
        pool = EndpointPool(servers, session, unreachable_after_s=spec.clients.request_timeout)
        client = GenerateClient(
            pool, policy=RetryPolicy(max_attempts=3), request_timeout_s=spec.clients.request_timeout, stream=False
        )

        async def one(prompt: dict[str, Any], input_ids: list[int]) -> CanaryRecord:
            body = orjson.dumps({"input_ids": input_ids, "sampling_params": sampling})
            reply = await client.generate(body)
            meta = reply.meta_info
            has_tools = bool(prompt.get("tools"))
            flags = rc.inspect_record(
                input_ids, reply.output_ids, meta.get("finish_reason"), meta.get("completion_tokens"), has_tools, expect
            )
            return CanaryRecord(
                prompt["id"],
                input_ids,
                reply.output_ids,
                meta.get("finish_reason"),
                meta.get("completion_tokens"),
                has_tools,
                flags,
            )

        records = await asyncio.gather(*(one(p, ids) for p, ids in rendered))
        await pool.close()
    finally:
        await session.close()
    if record_file is not None:
        await asyncio.to_thread(_write_records, record_file, list(records))
    ctx = canary_context(resolved, expect, spec.checks)
    return judge_canary(list(records), ctx, capped=cap < spec.generation.sampling.max_new_tokens)


def _write_records(path: Path, records: list[CanaryRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r.as_json()) + b"\n" for r in records))


def outcome_json(outcome: StepOutcome) -> bytes:
    """The verdict as compact JSON, trimmed to fit a Kubernetes termination message."""
    body = {
        "passed": outcome.passed,
        "reason": outcome.reason,
        "message": outcome.message,
        "checks": [c.model_dump(mode="json", exclude_defaults=True) for c in outcome.checks],
    }
    data = orjson.dumps(body)
    if len(data) > TERMINATION_LOG_LIMIT:
        body["checks"] = [c for c in body["checks"] if not c.get("passed")]
        body["message"] = body["message"][:1500]
        data = orjson.dumps(body)[:TERMINATION_LOG_LIMIT]
    return data


def outcome_from_json(data: bytes | str) -> StepOutcome:
    body = orjson.loads(data)
    checks = tuple(CheckResult.model_validate(c) for c in body.get("checks", []))
    return StepOutcome(bool(body["passed"]), str(body["reason"]), str(body["message"]), checks)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="datagen canary", description="Run the canary against running servers.")
    parser.add_argument("--run", required=True, help="the DataGenRun manifest")
    parser.add_argument("--server", action="append", required=True, help="server base URL (repeatable)")
    parser.add_argument("--tokenizer", help="tokenizer dir (default: model.tokenizerPath or model.path)")
    parser.add_argument("--dataset", help="dataset file (default: spec.dataset.path)")
    parser.add_argument("--records", help="where to write the canary's records (JSONL)")
    parser.add_argument("--termination-log", help="also write the JSON verdict here (Kubernetes termination message)")
    args = parser.parse_args(argv)

    from datagen_operator.api import load_run
    from datagen_operator.worker.render import load_tokenizer

    spec = load_run(args.run).spec
    resolved = resolve_model(spec)
    tokenizer = load_tokenizer(
        args.tokenizer or spec.model.tokenizer_path or spec.model.path, trust_remote_code=resolved.trust_remote_code
    )
    outcome = asyncio.run(
        run_canary(
            spec,
            tokenizer,
            Path(args.dataset or spec.dataset.path),
            args.server,
            Path(args.records) if args.records else None,
        )
    )
    data = outcome_json(outcome)
    sys.stdout.write(data.decode() + "\n")
    if args.termination_log:
        Path(args.termination_log).write_bytes(data)
    return 0 if outcome.passed else 1
