"""The parser check (ParsersVerified) as a program: read each ready server's /server_info and, in thinking runs, a
chat probe through its own template and parser; checks/server_truth.py judges what came back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiohttp

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks.server_truth import (
    PARSERS,
    model_label,
    probe_budgets,
    seed_ignored,
    servers_differ,
    verify_parsers,
)


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


async def verify_running_servers(
    session: aiohttp.ClientSession, urls: Sequence[str], spec: DataGenRunSpec, resolved: ResolvedModel | None = None
) -> tuple[StepOutcome, dict[str, Any]]:
    """ParsersVerified over every ready server (a run's replicas, or each URL of server.external), and the first
    one's /server_info: each one's parsers are checked, and servers that differ from each other are refused.
    Raises when a server cannot be read (see verify_running_server)."""
    resolved = resolved or resolve_model(spec)
    label = model_label(spec)
    infos: list[tuple[str, dict[str, Any]]] = []
    first: StepOutcome | None = None
    for url in urls:
        info, probe = await read_running_server(session, url, spec, resolved)
        outcome = verify_parsers(info, probe, resolved, label)
        ignored = seed_ignored(info, spec)
        if outcome.passed and ignored is not None:
            check = CheckResult(name=PARSERS, passed=False, count=1, total=1, verdict=ignored)
            outcome = StepOutcome(False, Reason.MISMATCH, ignored, (check,))
        if not outcome.passed:
            return (replace(outcome, message=f"{url}: {outcome.message}") if len(urls) > 1 else outcome), info
        infos.append((url, info))
        first = first or outcome
    assert first is not None, "at least one ready server"
    differ = servers_differ(infos)
    if differ is not None:
        check = CheckResult(name=PARSERS, passed=False, count=1, total=len(infos), verdict=differ)
        return StepOutcome(False, Reason.MISMATCH, differ, (check,)), infos[0][1]
    return first, infos[0][1]
