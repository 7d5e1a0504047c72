"""ParsersVerified: the running server's own word on its parsers, and a chat probe that proves the split.

Pure: the parser check (steps/parser_check.py) fetches /server_info and the probe's message, this module judges
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks.marker_advice import parser_advice, wrong_markers_verdict
from datagen_operator.output.fingerprint import diff_fingerprints, server_fingerprint
from datagen_operator.presets.sglang_names import resolved_reasoning_parser, resolved_tool_call_parser
from datagen_operator.presets.think_markers import (
    MarkersWritten,
    ThinkMarkers,
    fix_for,
    known_markers,
    markers_read_by,
    tool_parser_families,
    written_in,
)

PARSERS = "parsers"


def _describe(parser: str | None) -> str:
    if parser is None:
        return "no reasoning parser"
    markers = markers_read_by(parser)
    return f"`{parser}` ({markers.start})" if markers else f"`{parser}`"


def _run_markers(resolved: ResolvedModel) -> ThinkMarkers | None:
    if resolved.think_start is None or resolved.think_end is None:
        return None
    return ThinkMarkers(resolved.think_start, resolved.think_end)


def _families(resolved: ResolvedModel) -> tuple[str, ...]:
    """The model's family as the run says it: its preset's, else the family its tool-call parser is for."""
    if resolved.preset is not None:
        return (resolved.preset.family,)
    return tool_parser_families(resolved.tool_call_parser)


def _leak_cause(written: MarkersWritten | None, resolved: ResolvedModel, running: str | None, model_label: str) -> str:
    """Why the server's parser left markers in content, and the fix. Under a preset whose markers they are not,
    the model is wrong (or the preset), not the parser; otherwise the parser is named from the markers and the
    model's family (presets/think_markers.py), never the first parser whose tags match. `written` is None for
    the run's own model.thinkTokens, which no parser is known to read."""
    preset = resolved.preset
    own = _run_markers(resolved)
    if preset is not None and written is not None and written.markers != own:
        return wrong_markers_verdict(written, "the model writes", preset.name, own.shown() if own else None)
    advice = "check the model's think tags"
    if written is not None:
        fix = fix_for(written, _families(resolved))
        # The parser the server already runs is no fix: then the split went wrong elsewhere.
        if fix.parser is None or fix.parser != running:
            advice = parser_advice(fix)
    return f"the server's reasoning parser {_describe(running)} does not match what {model_label} writes; {advice}"


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
    known_tags = {tag for pair in known_markers() for tag in pair}
    known_tags |= {tag for tag in (resolved.think_start, resolved.think_end) if tag}
    leaked_tags = sorted(tag for tag in known_tags if tag in content)
    if leaked_tags and not reasoning.strip():
        cause = _leak_cause(written_in(content), resolved, running_reasoning, model_label)
        return f"a chat probe got empty reasoning_content and {', '.join(leaked_tags)} inside content: {cause}", ""
    if leaked_tags:
        return f"a chat probe found {', '.join(leaked_tags)} inside content: the reasoning split is off", ""
    if probe.get("finish_reason") == "length":
        return (
            None,
            "the chat probe's reply was cut at its max_tokens before it ended (inconclusive; the canary judges)",
        )
    if not reasoning.strip():
        return None, "the chat probe's reply holds no reasoning and no think tags (the canary judges the model)"
    other, own = written_in(reasoning), _run_markers(resolved)
    if other is not None and other.markers != own:
        # Another family's markers inside the reasoning: the parser took them for reasoning, the model is wrong.
        expected = f", not {model_label}'s {own.shown()}" if own else ""
        return None, f"the chat probe's reasoning holds {other.shown()}{expected} (the canary judges the model)"
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
        return StepOutcome(False, Reason.MISMATCH, message, (check,))
    message = (
        f"SGLang {info.get('version', '?')} runs reasoning parser {resolved.reasoning_parser or 'none'} and "
        f"tool-call parser {resolved.tool_call_parser or 'none'}" + (f"; {shown}" if shown else "")
    )
    return StepOutcome(
        True, Reason.VERIFIED, message, (CheckResult(name=PARSERS, passed=True, total=1, verdict=message),)
    )


PROBE_FIRST_MAX_TOKENS = 4096
"""Most probe replies end well within this; a reasoning model cut here is asked again with the run's budget."""


def probe_budgets(max_new_tokens: int) -> tuple[int, ...]:
    """The chat probe's max_tokens, tried in order while the reply is cut (`finish_reason: length`)."""
    first = min(PROBE_FIRST_MAX_TOKENS, max_new_tokens)
    return (first,) if first == max_new_tokens else (first, max_new_tokens)


def model_label(spec: DataGenRunSpec) -> str:
    """How verdicts name the model: its preset, or its path when there is none."""
    return spec.model.preset or spec.model.path


def external_server_flags(spec: DataGenRunSpec, resolved: ResolvedModel | None = None) -> str:
    """What the deployer of a server.external must have launched it with, as the parser check will hold it to."""
    resolved = resolved or resolve_model(spec)
    flags = [
        f"--reasoning-parser {resolved.reasoning_parser}" if resolved.reasoning_parser else "no --reasoning-parser",
        f"--tool-call-parser {resolved.tool_call_parser}" if resolved.tool_call_parser else "no --tool-call-parser",
    ]
    if spec.generation.sampling.sampling_seed is not None:
        flags.append("--enable-deterministic-inference")
    return (
        f"the external server must run with {', '.join(flags)} (its deployer's flags: the parser check reads them "
        "on its /server_info next)"
    )


def seed_ignored(info: dict[str, Any], spec: DataGenRunSpec) -> str | None:
    """A sampling_seed the server would ignore: SGLang uses a request's seed only under
    --enable-deterministic-inference, which the run sets on its own server and cannot set on an external one."""
    if spec.generation.sampling.sampling_seed is None or info.get("enable_deterministic_inference", True):
        return None
    return (
        "generation.sampling.sampling_seed is set but the server runs without --enable-deterministic-inference, so "
        "SGLang ignores the seed; launch it with --enable-deterministic-inference, or remove sampling_seed"
    )


def _model_name(info: dict[str, Any]) -> Any:
    """The model a server says it serves: its --served-model-name, which SGLang defaults to its --model-path."""
    return info.get("served_model_name") or info.get("model_path")


def servers_differ(infos: Sequence[tuple[str, dict[str, Any]]]) -> str | None:
    """Why servers that serve one run would make different data, or None: another model name, or another
    data-affecting /server_info (a flag, a format; the workers refuse the same at their start, worker/startup.py).
    Each one's parsers are held to the run's by verify_parsers."""
    first_url, first_info = infos[0]
    first = server_fingerprint(first_info)
    for url, info in infos[1:]:
        changes = diff_fingerprints(first, server_fingerprint(info))
        if _model_name(info) != _model_name(first_info):
            changes.insert(0, f"model: {_model_name(first_info)} -> {_model_name(info)}")
        if changes:
            return f"servers {first_url} and {url} differ: {'; '.join(changes)}; every server of a run must run alike"
    return None
