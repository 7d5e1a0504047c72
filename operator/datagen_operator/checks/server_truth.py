"""ParsersVerified: the running server's own word on its parsers, and a chat probe that proves the split.

Pure: the shells fetch /server_info and the probe's message, this module judges them.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.control.observed import StepOutcome
from datagen_operator.engine.sglang_names import REASONING_PARSER_TAGS

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


def verify_parsers(
    info: dict[str, Any], probe: dict[str, Any] | None, resolved: ResolvedModel, model_label: str
) -> StepOutcome:
    """Compare /server_info with the resolved parsers; then read the chat probe's message (thinking runs)."""
    problems: list[str] = []
    running_reasoning = info.get("reasoning_parser") or None
    running_tools = info.get("tool_call_parser") or None
    expected_start = resolved.think_start or "<think>"

    if running_reasoning != resolved.reasoning_parser:
        if running_reasoning is None:
            problems.append(
                f"the server runs without --reasoning-parser: chat completions return reasoning_content null and "
                f"the thinking inside content; launch it with --reasoning-parser {resolved.reasoning_parser}"
            )
        else:
            problems.append(
                f"the server's reasoning parser is {_describe(running_reasoning)} but {model_label} writes "
                f"{expected_start}; use {resolved.reasoning_parser or 'none'}"
            )
    if running_tools != resolved.tool_call_parser:
        problems.append(
            f"the server's tool-call parser is `{running_tools}` but {model_label} needs "
            f"`{resolved.tool_call_parser}`; use --tool-call-parser {resolved.tool_call_parser}"
        )

    if probe is not None and resolved.thinking and not problems:
        reasoning = probe.get("reasoning_content") or ""
        content = probe.get("content") or ""
        known_tags = {tag for pair in REASONING_PARSER_TAGS.values() for tag in pair}
        known_tags |= {tag for tag in (resolved.think_start, resolved.think_end) if tag}
        leaked_tags = sorted(tag for tag in known_tags if tag in content)
        if not reasoning.strip():
            suggestion = _suggest(content, running_tools)
            fix = (
                f"use {suggestion}"
                if suggestion and suggestion != running_reasoning
                else "check the model's think tags"
            )
            problems.append(
                "a chat probe got empty reasoning_content"
                + (f" and {', '.join(leaked_tags)} inside content" if leaked_tags else "")
                + f": the server's reasoning parser {_describe(running_reasoning)} does not match what {model_label} "
                f"writes; {fix}"
            )
        elif leaked_tags:
            problems.append(f"a chat probe found {', '.join(leaked_tags)} inside content: the reasoning split is off")
        elif not content.strip() and not probe.get("tool_calls"):
            problems.append(
                f"a chat probe got all of its output as reasoning_content and no content: {model_label} did not write "
                f"{resolved.think_end or 'a think end'}; it may ignore thinking (an instruct model under a thinking "
                "preset?) or never close its reasoning; check model.path and the preset"
            )

    version = info.get("version", "?")
    if problems:
        message = "; ".join(problems)
        check = CheckResult(name=PARSERS, passed=False, count=len(problems), total=1, verdict=message)
        return StepOutcome(False, "Mismatch", message, (check,))
    probed = " and a chat probe split reasoning_content from content" if probe is not None and resolved.thinking else ""
    message = (
        f"SGLang {version} runs reasoning parser {resolved.reasoning_parser or 'none'} and tool-call parser "
        f"{resolved.tool_call_parser or 'none'}{probed}"
    )
    return StepOutcome(True, "Verified", message, (CheckResult(name=PARSERS, passed=True, total=1, verdict=message),))


def model_label(spec: DataGenRunSpec) -> str:
    """How verdicts name the model: its preset, or its path when there is none."""
    return spec.model.preset or spec.model.path


async def read_running_server(
    session: aiohttp.ClientSession, url: str, spec: DataGenRunSpec
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """/server_info, and in thinking runs a chat probe through the server's own template and parser.
    Raises when the server cannot be read."""
    from datagen_operator.engine.client import chat_probe
    from datagen_operator.worker.client import fetch_server_info
    from datagen_operator.worker.render import template_variables

    resolved = resolve_model(spec)
    info = await fetch_server_info(session, url)
    probe = None
    if resolved.thinking:
        model = spec.model.served_model_name or spec.model.path
        probe = await chat_probe(session, url, model, template_variables(resolved))
    return info, probe


async def verify_running_server(session: aiohttp.ClientSession, url: str, spec: DataGenRunSpec) -> StepOutcome:
    """ParsersVerified for a server that answers health checks; failing to read it is itself the verdict."""
    try:
        info, probe = await read_running_server(session, url, spec)
    except Exception as error:  # any way of not answering counts: the verdict carries it
        return StepOutcome(False, "ProbeFailed", f"could not read the server's parsers at {url}: {error}")
    return verify_parsers(info, probe, resolve_model(spec), model_label(spec))
