"""ParsersVerified: the running server's own word on its parsers, and a chat probe that proves the split.

Pure: the shells fetch /server_info and the probe's message, this module judges them.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.presets.sglang_names import (
    REASONING_PARSER_TAGS,
    resolved_reasoning_parser,
    resolved_tool_call_parser,
)

PARSERS = "parsers"


def _describe(parser: str | None) -> str:
    if parser is None:
        return "no reasoning parser"
    tags = REASONING_PARSER_TAGS.get(parser)
    return f"`{parser}` ({tags[0]})" if tags else f"`{parser}`"


def _suggest(content: str, tool_parser: str | None) -> str | None:
    """A parser whose tags appear in the content, preferring the one named like the tool-call parser."""
    matching = [name for name, (start, end) in REASONING_PARSER_TAGS.items() if end in content or start in content]
    if tool_parser in matching:
        return tool_parser
    return matching[0] if matching else None


def _name_problems(info: dict[str, Any], resolved: ResolvedModel, model_label: str) -> list[str]:
    """/server_info's parsers against the run's, both as SGLang resolves them (`qwen25` runs as `qwen`)."""
    problems: list[str] = []
    running_reasoning = info.get("reasoning_parser") or None
    running_tools = info.get("tool_call_parser") or None
    wanted_reasoning = resolved_reasoning_parser(resolved.reasoning_parser)
    wanted_tools = resolved_tool_call_parser(resolved.tool_call_parser)
    if running_reasoning != wanted_reasoning:
        if running_reasoning is None:
            problems.append(
                f"the server runs without --reasoning-parser: chat completions return reasoning_content null and "
                f"the thinking inside content; launch it with --reasoning-parser {resolved.reasoning_parser}"
            )
        else:
            problems.append(
                f"the server's reasoning parser is {_describe(running_reasoning)} but {model_label} writes "
                f"{resolved.think_start or '<think>'}; use {resolved.reasoning_parser or 'none'}"
            )
    if running_tools != wanted_tools:
        runs_as = f" (SGLang runs it as `{wanted_tools}`)" if wanted_tools != resolved.tool_call_parser else ""
        problems.append(
            f"the server's tool-call parser is `{running_tools}` but {model_label} needs "
            f"`{resolved.tool_call_parser}`{runs_as}; use --tool-call-parser {resolved.tool_call_parser}"
        )
    return problems


def _read_probe(
    probe: dict[str, Any], resolved: ResolvedModel, running_reasoning: str | None, model_label: str
) -> tuple[str | None, str]:
    """(a parser problem or None, what the probe showed). Only a split the parser got wrong is a problem here:
    a model that does not reason, never closes its reasoning or was cut short is the canary's to name, on raw
    token ids, where the template and the model can be told apart."""
    message = probe.get("message") or {}
    reasoning = message.get("reasoning_content") or ""
    content = message.get("content") or ""
    known_tags = {tag for pair in REASONING_PARSER_TAGS.values() for tag in pair}
    known_tags |= {tag for tag in (resolved.think_start, resolved.think_end) if tag}
    leaked_tags = sorted(tag for tag in known_tags if tag in content)
    if leaked_tags and not reasoning.strip():
        suggestion = _suggest(content, resolved.tool_call_parser)
        fix = f"use {suggestion}" if suggestion and suggestion != running_reasoning else "check the model's think tags"
        return (
            f"a chat probe got empty reasoning_content and {', '.join(leaked_tags)} inside content: the server's "
            f"reasoning parser {_describe(running_reasoning)} does not match what {model_label} writes; {fix}",
            "",
        )
    if leaked_tags:
        return f"a chat probe found {', '.join(leaked_tags)} inside content: the reasoning split is off", ""
    if probe.get("finish_reason") == "length":
        return (
            None,
            "the chat probe's reply was cut at its max_tokens before it ended (inconclusive; the canary judges)",
        )
    if not reasoning.strip():
        return None, "the chat probe's reply holds no reasoning and no think tags (the canary judges the model)"
    if not content.strip() and not message.get("tool_calls"):
        return None, "the chat probe's reply never closed its reasoning (the canary judges the model)"
    return None, "a chat probe split reasoning_content from content"


def verify_parsers(
    info: dict[str, Any], probe: dict[str, Any] | None, resolved: ResolvedModel, model_label: str
) -> StepOutcome:
    """Compare /server_info with the resolved parsers; then read the chat probe's choice (thinking runs)."""
    problems = _name_problems(info, resolved, model_label)
    shown = ""
    if probe is not None and resolved.thinking and not problems:
        problem, shown = _read_probe(probe, resolved, info.get("reasoning_parser") or None, model_label)
        if problem:
            problems.append(problem)
    if problems:
        message = "; ".join(problems)
        check = CheckResult(name=PARSERS, passed=False, count=len(problems), total=1, verdict=message)
        return StepOutcome(False, "Mismatch", message, (check,))
    message = (
        f"SGLang {info.get('version', '?')} runs reasoning parser {resolved.reasoning_parser or 'none'} and "
        f"tool-call parser {resolved.tool_call_parser or 'none'}" + (f"; {shown}" if shown else "")
    )
    return StepOutcome(True, "Verified", message, (CheckResult(name=PARSERS, passed=True, total=1, verdict=message),))


PROBE_FIRST_MAX_TOKENS = 4096
"""Most probe replies end well within this; a reasoning model cut here is asked again with the run's budget."""


def probe_budgets(max_new_tokens: int) -> tuple[int, ...]:
    """The chat probe's max_tokens, tried in order while the reply is cut (`finish_reason: length`)."""
    first = min(PROBE_FIRST_MAX_TOKENS, max_new_tokens)
    return (first,) if first == max_new_tokens else (first, max_new_tokens)


def model_label(spec: DataGenRunSpec) -> str:
    """How verdicts name the model: its preset, or its path when there is none."""
    return spec.model.preset or spec.model.path


async def read_running_server(
    session: aiohttp.ClientSession, url: str, spec: DataGenRunSpec, resolved: ResolvedModel | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """/server_info, and in thinking runs a chat probe through the server's own template and parser (its
    choice: message and finish_reason). Raises when the server cannot be read."""
    from datagen_operator.engine.client.reads import chat_probe, fetch_server_info
    from datagen_operator.prompts.render import template_variables

    resolved = resolved or resolve_model(spec)
    info = await fetch_server_info(session, url)
    probe = None
    if resolved.thinking:
        model = spec.model.served_model_name or spec.model.path
        for budget in probe_budgets(spec.generation.sampling.max_new_tokens):
            probe = await chat_probe(session, url, model, template_variables(resolved), budget)
            if probe.get("finish_reason") != "length":
                break
    return info, probe


async def verify_running_server(
    session: aiohttp.ClientSession, url: str, spec: DataGenRunSpec, resolved: ResolvedModel | None = None
) -> StepOutcome:
    """ParsersVerified for a server that answers health checks. Raises when the server cannot be read: the
    shells count the failures and control.decide bounds the retries (ProbeFailed)."""
    resolved = resolved or resolve_model(spec)
    info, probe = await read_running_server(session, url, spec, resolved)
    return verify_parsers(info, probe, resolved, model_label(spec))
