"""The canary's verdict, pure: its records judged by every raw-token check (no thresholds: the canary is small),
the model's thinking told apart (never closes its reasoning, or does not reason), another family's markers named,
and whether the run's requests in flight keep the servers' batches full. steps/canary.py sends the requests."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import orjson

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.reasons import Reason
from datagen_operator.api.spec import AUTO_CONCURRENCY, DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.batch_fill import (
    BATCH_FULL,
    auto_concurrency,
    judge_batch_fill,
    suggested_concurrency,
    underfilled,
)
from datagen_operator.checks.evaluate import CheckContext, MarkersSeen, evaluate
from datagen_operator.checks.samples import SampleComparison
from datagen_operator.engine.limits import BatchLimits
from datagen_operator.presets.think_markers import MarkersWritten
from datagen_operator.tokenizer.families import FAMILIES

MODEL_THINKING = "model_thinking"


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


def second_samples(records: list[CanaryRecord], again: list[CanaryRecord | None]) -> Counts:
    """Each prompt's first sample beside its second (sent as the workers send sample 1): the identical-samples
    check's counts (checks.samples), for the prompts the server answered twice."""
    comparison = SampleComparison(2)
    for first, second in zip(records, again, strict=True):
        if second is not None:
            comparison.add(first.id, orjson.dumps(first.output_ids))
            comparison.add(second.id, orjson.dumps(second.output_ids))
    return comparison.counts()
