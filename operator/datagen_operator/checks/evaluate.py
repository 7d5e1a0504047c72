"""From counted record flags to named checks with a rate, a threshold and a verdict (cause and fix).

One evaluation for the rolling checks (workers' counters), the canary and `datagen verify`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from datagen_operator.api.flags import (
    ABORTED,
    BAD_TERMINATION,
    EMPTY_REASONING,
    NAN_REPLACED,
    NO_THINK_END,
    NO_THINK_START,
    PROMPT_CLOSES_THINK,
    PROMPT_SUFFIX_LEAK,
    RETRACTED,
    TOKEN_COUNT_MISMATCH,
    TRUNCATED,
    TRUNCATED_BY_MEMORY,
    UNBALANCED_TOOL_CALLS,
    UNEXPECTED_REASONING,
)
from datagen_operator.api.progress import TOO_LONG, Counts
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks.marker_advice import wrong_markers_verdict
from datagen_operator.checks.rates import CONFIDENCE, judge_min_rate, judge_rate, pct
from datagen_operator.presets.think_markers import MarkersWritten, ThinkMarkers

REASONING_CAPTURED = "reasoning_captured"
TOKEN_COUNTS = "token_counts"
TERMINATION = "termination"
TRUNCATION = "truncation"
TOOL_CALLS = "tool_calls"
SERVER_ERRORS = "server_errors"
MALFORMED = "malformed"
DUPLICATES = "duplicates"
SERVER_FAILURES = "server_failures"
OUTPUT_VOLUME = "output_volume"
RETRACTIONS = "retractions"
IDENTICAL_SAMPLES = "identical_samples"

# Thresholds of the causes spec.checks has no field for (docs/checks.md).
MAX_MALFORMED_RATE = 0.10
"""Dataset lines set aside (bad JSON, id, messages, tools) or prompts the template cannot render: past one in
ten, the file or its format is likely the wrong one."""
MAX_DUPLICATE_RATE = 0.50
"""Dataset lines that repeat an earlier line's id (or content): each is generated once, so a few are harmless
(LLaMA-Factory's glaive demo repeats 35 of 300); past half, spec.dataset.idField likely names no per-line id."""
MAX_TOO_LONG_RATE = 0.10
"""Prompts set aside because prompt + max_new_tokens exceeds the server's context."""
MIN_RECORDS_TO_JUDGE = 16
"""Records before the record checks give a verdict (rolling checks, an existing output at the preflight). Every
rate is judged by checks.rates' bound, so a small sample cannot halt on noise; below this DataFaithful stays
Unknown (collecting) rather than showing a verdict on the first few records."""
MAX_SERVER_FAILURE_RATE = 0.05
"""Records that ran out of attempts (5xx, timeouts, resets): a rerun retries them, but this many means a
sick server."""


@dataclass(frozen=True)
class MarkersSeen:
    """Another family's think markers in the outputs, read off their ids (rc.other_markers_in): where the run's
    own markers are missing, these are the cause to name."""

    written: MarkersWritten
    outputs: int
    """Outputs that hold them."""
    families: tuple[str, ...] = ()
    """The families the run's tokenizer belongs to (its vocabulary): which of the markers' writers the model is."""


@dataclass(frozen=True)
class CheckContext:
    """What the verdicts need to name causes: the run's thinking mode and tokens."""

    thinking: bool
    preset: str | None
    think_start: str | None
    think_end: str | None
    think_end_id: int | None
    thresholds: ChecksSpec
    markers_seen: MarkersSeen | None = None
    """Set by the canary, which has the outputs' ids; the rolling checks count flags only."""


def check_context(
    resolved: ResolvedModel | None,
    thresholds: ChecksSpec,
    think_end_id: int | None = None,
    *,
    thinking: bool = False,
    preset: str | None = None,
) -> CheckContext:
    """The one builder of a CheckContext, from the model as resolved for the run. `think_end_id`: what the run's
    tokenizer calls the think-end text (rc.expectations_for), else the preset's fixed id (the operator mounts no
    tokenizer). Without a resolved model (an output verified alone) `thinking` and `preset` come from its
    fingerprint."""
    known = resolved.preset if resolved else None
    if think_end_id is None and known is not None and known.think_end is not None:
        think_end_id = known.think_end.id
    return CheckContext(
        thinking=resolved.thinking if resolved else thinking,
        preset=known.name if known else preset,
        think_start=resolved.think_start if resolved else None,
        think_end=resolved.think_end if resolved else None,
        think_end_id=think_end_id,
        thresholds=thresholds,
    )


def _rate(count: int, total: int) -> float:
    return count / total if total else 0.0


def _frac(count: int, total: int) -> str:
    return f"{count}/{total}"


def evaluate(counts: Counts, ctx: CheckContext) -> list[CheckResult]:
    """Every check over the counts; a check with nothing to look at passes with total 0."""
    return [
        *record_checks(counts, ctx),
        _server_errors(counts, ctx),
        *dataset_checks(counts),
        _server_failures(counts),
        _output_volume(counts),
    ]


def record_checks(counts: Counts, ctx: CheckContext) -> list[CheckResult]:
    """The checks over written records' flags: what an existing output is judged by before a resume."""
    return [
        _reasoning(counts, ctx),
        _token_counts(counts, ctx),
        _termination(counts),
        _truncation(counts, ctx),
        _tool_calls(counts, ctx),
        _retractions(counts, ctx),
        _identical_samples(counts, ctx),
    ]


def dataset_checks(counts: Counts) -> list[CheckResult]:
    """The checks over the dataset's lines set aside: known before any server (the preflight)."""
    return [_malformed(counts), _duplicates(counts), _too_long(counts)]


THRESHOLD_FIELDS: dict[str, str] = {
    REASONING_CAPTURED: "spec.checks.minReasoningRate",
    TOKEN_COUNTS: "spec.checks.maxTokenMismatchRate",
    TRUNCATION: "spec.checks.maxTruncationRate",
    TOOL_CALLS: "spec.checks.maxErrorRate",
    SERVER_ERRORS: "spec.checks.maxErrorRate",
    RETRACTIONS: "spec.checks.maxRetractionRate",
    IDENTICAL_SAMPLES: "spec.checks.maxIdenticalSampleRate",
}
"""The spec field that sets each check's threshold (the others are fixed: docs/checks.md)."""

CHECK_FLAGS: dict[str, tuple[str, ...]] = {
    REASONING_CAPTURED: (NO_THINK_END, EMPTY_REASONING, NO_THINK_START, UNEXPECTED_REASONING),
    TOKEN_COUNTS: (TOKEN_COUNT_MISMATCH, PROMPT_SUFFIX_LEAK),
    TERMINATION: (BAD_TERMINATION, ABORTED, NAN_REPLACED),
    TRUNCATION: (TRUNCATED,),
    TOOL_CALLS: (UNBALANCED_TOOL_CALLS,),
    RETRACTIONS: (RETRACTED,),
}
"""The record flags each record check counts."""


def measured(check: CheckResult) -> str:
    """A failed check in numbers: `truncation 3/25 = 12.0%, threshold 2.0%, 95% bound 3.4%` (bound: what
    checks.rates judged against the threshold)."""
    rate = f"{check.rate:.1%}" if check.rate is not None else "?"
    threshold = f"{check.threshold:.1%}" if check.threshold is not None else "?"
    bound = f", {pct(CONFIDENCE)} bound {check.bound:.1%}" if check.bound is not None else ""
    return f"{check.name} {check.count}/{check.total} = {rate}, threshold {threshold}{bound}"


def _own_markers(ctx: CheckContext) -> str | None:
    if ctx.think_start is None or ctx.think_end is None:
        return None
    ids = f" ({ctx.think_end_id})" if ctx.think_end_id is not None else ""
    return ThinkMarkers(ctx.think_start, ctx.think_end).shown() + ids


def _wrong_markers(seen: MarkersSeen, n: int, ctx: CheckContext) -> str:
    who = f"{_frac(seen.outputs, n)} outputs write"
    return wrong_markers_verdict(seen.written, who, ctx.preset, _own_markers(ctx), seen.families)


_OFF_LINES_REASONED = (
    "outputs of lines that turn thinking off themselves (their chat_template_kwargs) contain think tags: the "
    "model reasoned where the line's prompt closed the think block; check the template's switch and the line's"
)


def _reasoning(counts: Counts, ctx: CheckContext) -> CheckResult:
    n = counts.records
    end = f"`{ctx.think_end}` ({ctx.think_end_id})" if ctx.think_end_id is not None else f"`{ctx.think_end}`"
    seen = ctx.markers_seen
    if seen is not None and (ctx.think_end is None or ctx.think_end_id is None):
        # Outputs with another family's markers where no flag can judge the run's own: a preset that does not
        # reason, or run markers that are no token of this vocabulary (no preset, `kimi` on a Qwen3 model).
        rate = _rate(seen.outputs, n)
        return CheckResult(
            name=REASONING_CAPTURED, passed=False, rate=1 - rate, threshold=1.0, count=seen.outputs, total=n,
            verdict=_wrong_markers(seen, n, ctx),
        )  # fmt: skip
    if ctx.think_end is None:
        return CheckResult(name=REASONING_CAPTURED, passed=True, total=n, verdict="model has no reasoning tokens")
    if not ctx.thinking:
        return _reasoning_off(counts, ctx)
    missing_end = counts.count(NO_THINK_END)
    empty = counts.count(EMPTY_REASONING)
    no_start = counts.count(NO_THINK_START)
    closed_prompts = counts.count(PROMPT_CLOSES_THINK)
    # Records of lines that turn thinking off themselves are flagged as off records are (Expectations.for_line).
    unexpected = counts.count(UNEXPECTED_REASONING)
    bad = missing_end + empty + no_start + unexpected
    judged = judge_min_rate(n - bad, n, ctx.thresholds.min_reasoning_rate)
    passed = judged.passed
    # Another family's markers where the run's are missing say why: not "does not think", nor "never closed".
    wrong = seen if missing_end or no_start else None
    causes: list[str] = []
    if wrong is not None:
        causes.append(_wrong_markers(wrong, n, ctx))
    elif missing_end:
        causes.append(f"no {end} in {_frac(missing_end, n)} outputs")
    if closed_prompts:
        causes.append(
            f"the prompts end with `{ctx.think_start}{ctx.think_end}`: thinking is off in the rendered template; "
            "set generation.thinking: true (and check the template's thinking switch)"
        )
    elif missing_end and wrong is None:
        causes.append(
            "the reasoning was never closed, or never happened: check the chat template (the prompt must end with "
            f"`{ctx.think_start}` or let the model open it), max_new_tokens, and that the model is a thinking model"
        )
    if empty:
        causes.append(f"empty reasoning before {end} in {_frac(empty, n)} outputs: the model skipped thinking")
    if no_start and wrong is None:
        causes.append(
            f"`{ctx.think_start}` never opened in {_frac(no_start, n)} outputs (nor at the end of the prompt): the model "
            "does not think (an instruct model under a thinking preset?); check model.path and model.preset"
        )
    if unexpected:
        causes.append(f"{_frac(unexpected, n)} {_OFF_LINES_REASONED}")
    captured = f"reasoning captured in {_frac(n - bad, n)} outputs ({judged.said_of_good('outputs')})"
    # Failed: the causes first (the true cause is read first); passed: the numbers, then what was seen.
    verdict = "; ".join([*causes, captured] if not passed else [captured, *causes])
    return CheckResult(
        name=REASONING_CAPTURED,
        passed=passed,
        rate=1 - judged.rate,
        threshold=ctx.thresholds.min_reasoning_rate,
        bound=1 - judged.bound,
        count=bad,
        total=n,
        verdict=verdict,
    )


def _reasoning_off(counts: Counts, ctx: CheckContext) -> CheckResult:
    """Thinking off: no output may hold think markers, the run's or another family's."""
    n, seen = counts.records, ctx.markers_seen
    own = counts.count(UNEXPECTED_REASONING)
    # Records of lines that turn thinking on themselves are flagged as on records are (Expectations.for_line).
    unreasoned = counts.count(NO_THINK_END) + counts.count(EMPTY_REASONING) + counts.count(NO_THINK_START)
    # The same output may hold both: the larger count is the least number of outputs at fault.
    bad = max(own, seen.outputs if seen else 0) + unreasoned
    causes: list[str] = []
    if unreasoned:
        causes.append(
            f"{_frac(unreasoned, n)} outputs of lines that turn thinking on themselves (their chat_template_kwargs) "
            "hold no closed reasoning: the model did not reason where the line asked it to"
        )
    if own:
        causes.append(
            f"{_frac(own, n)} outputs contain think tags although the prompts close the think block "
            "(thinking off): the template and the model disagree; check generation.thinking and the chat template"
        )
    if seen is not None:
        causes.insert(0, _wrong_markers(seen, n, ctx))
    verdict = "; ".join(causes) or f"no reasoning in {_frac(n, n)} outputs, as asked (thinking off)"
    judged = judge_rate(bad, n, 0.0)
    return CheckResult(
        name=REASONING_CAPTURED, passed=judged.passed, rate=1 - judged.rate, threshold=1.0, bound=1 - judged.bound,
        count=bad, total=n, verdict=verdict,
    )  # fmt: skip


def _token_counts(counts: Counts, ctx: CheckContext) -> CheckResult:
    n, bad, leaks = counts.records, counts.count(TOKEN_COUNT_MISMATCH), counts.count(PROMPT_SUFFIX_LEAK)
    if leaks:
        failed = (
            f"output_ids start with prompt-suffix tokens in {_frac(leaks, n)} records (the upstream SGLang bug of "
            "issues 10896/17240)"
        )
        fix = "use an SGLang version with the fix; the affected records are not training data"
    else:
        failed = f"len(output_ids) != completion_tokens in {_frac(bad, n)} records"
        fix = "the server's token accounting is off"
    return _rate_check(
        TOKEN_COUNTS,
        bad,
        n,
        ctx.thresholds.max_token_mismatch_rate,
        "records",
        f"len(output_ids) != completion_tokens in {_frac(bad, n)} records"
        if bad
        else f"len(output_ids) == completion_tokens in {_frac(n, n)} records",
        failed,
        fix,
    )


def _termination(counts: Counts) -> CheckResult:
    n = counts.records
    bad = counts.count(BAD_TERMINATION)
    aborted = counts.count(ABORTED)
    nan = counts.count(NAN_REPLACED)
    count = bad + aborted + nan
    if count == 0:
        verdict = "every finished output ends with a stop token"
    else:
        parts = []
        if nan:
            parts.append(
                f'{_frac(nan, n)} outputs ended on SGLang\'s NaN guard (finish_reason.matched "NaN happened"): the '
                "model sampled an id outside its vocabulary (NaN or inf logits) and SGLang wrote a stop id in its "
                "place; these records are not what the model generated: check the weights, dtype/quantization and "
                "the kernels (a numerically broken server), then regenerate them"
            )
        if bad:
            parts.append(
                f"{_frac(bad, n)} outputs finished `stop` without a stop token last: output_ids were trimmed or "
                "a stop string ended them; do not set `stop` strings for token data"
            )
        if aborted:
            parts.append(f"{_frac(aborted, n)} requests were aborted by the server")
        verdict = "; ".join(parts)
    judged = judge_rate(count, n, 0.0)
    return CheckResult(
        name=TERMINATION,
        passed=judged.passed,
        rate=judged.rate,
        threshold=0.0,
        bound=judged.bound,
        count=count,
        total=n,
        verdict=verdict,
    )


def _rate_check(
    name: str, count: int, total: int, threshold: float, noun: str, what: str, failed: str, fix: str
) -> CheckResult:
    """A max-rate check, judged by checks.rates: it fails only when the sample shows clearly that the rate is
    above the threshold. `what` says the count ('3/25 outputs hit max_new_tokens'), `failed` how it reads when
    the check fails, `fix` what to do; the rate, its bound and the sample size (`noun`) are said between (not
    for a count of 0: nothing to weigh)."""
    judged = judge_rate(count, total, threshold)
    said = judged.said(noun)
    if count == 0:
        return CheckResult(
            name=name, passed=True, rate=0.0, threshold=threshold, bound=0.0, count=0, total=total, verdict=what
        )
    return CheckResult(
        name=name,
        passed=judged.passed,
        rate=judged.rate,
        threshold=threshold,
        bound=judged.bound,
        count=count,
        total=total,
        verdict=f"{what} ({said})" if judged.passed else f"{failed} ({said}): {fix}",
    )


MEMORY_FIX = (
    "give the server more KV memory (server.memFractionStatic, more GPUs in server.tensorParallel) or shorten the "
    "prompts: SGLang caps a request's new tokens to what its KV pool holds beside the prompt (max_total_num_tokens "
    "in /server_info, in pages), so raising max_new_tokens cannot help these"
)


def _truncation(counts: Counts, ctx: CheckContext) -> CheckResult:
    n, truncated, limit = counts.records, counts.count(TRUNCATED), ctx.thresholds.max_truncation_rate
    by_memory = counts.count(TRUNCATED_BY_MEMORY)
    counted = f"{_frac(truncated, n)} outputs hit max_new_tokens"
    fix = "raise generation.sampling.max_new_tokens"
    if by_memory:
        # SGLang ends a capped answer `length` at the cap: the same finish, another cause and another fix.
        counted = (
            f"{_frac(truncated, n)} outputs ended `length`, {by_memory} of them short of max_new_tokens "
            "(capped by the server's KV memory)"
        )
        fix = MEMORY_FIX if by_memory == truncated else f"{MEMORY_FIX}; for the others {fix}"
    return _rate_check(TRUNCATION, truncated, n, limit, "outputs", counted, counted, fix)


def _tool_calls(counts: Counts, ctx: CheckContext) -> CheckResult:
    # Workers' counters do not carry how many records offered tools: then all records are the
    # denominator (a lower rate, never a false alarm); verify and the canary count them exactly.
    n, bad = counts.tool_records or counts.records, counts.count(UNBALANCED_TOOL_CALLS)
    return _rate_check(
        TOOL_CALLS,
        bad,
        n,
        ctx.thresholds.max_error_rate,
        "outputs with tools",
        f"unbalanced tool-call markers in {_frac(bad, n)} outputs with tools"
        if bad
        else f"tool-call sections balanced in {_frac(n, n)} outputs with tools",
        f"unbalanced tool-call markers in {_frac(bad, n)} outputs with tools",
        "the model's tool format and the chat template disagree",
    )


def _retractions(counts: Counts, ctx: CheckContext) -> CheckResult:
    # Flagged only where the run's sampling keeps state over the output (record_checks.RETRACTED).
    n, bad = counts.records, counts.count(RETRACTED)
    return _rate_check(
        RETRACTIONS,
        bad,
        n,
        ctx.thresholds.max_retraction_rate,
        "outputs",
        f"{_frac(bad, n)} outputs retracted where the sampling restarts"
        if bad
        else f"no output of {n} retracted where the sampling restarts (penalties, min_new_tokens)",
        f"{_frac(bad, n)} outputs were retracted by SGLang (its KV memory ran short) and re-prefilled: their "
        "penalties and min_new_tokens started again from zero, so they were not sampled as asked",
        "give the server more KV memory (server.memFractionStatic, more GPUs in server.tensorParallel) or send "
        "fewer requests at once (clients.concurrency); datagen export --exclude-flags retracted leaves them out",
    )


IDENTICAL_SAMPLES_FIX = (
    "SGLang samples each request anew, so the samples shared one seed or the server samples greedily. One seed: "
    "a server started with --enable-deterministic-inference (or --rl-on-policy-target) gives every request "
    "without a sampling_seed seed 42; set generation.sampling.sampling_seed (sample k is sent seed + k) or "
    "start the server without the flag. Greedy: the server forces temperature 0 or top_k 1 (its "
    "--preferred-sampling-params); set generation.sampling.temperature above 0"
)


def _identical_samples(counts: Counts, ctx: CheckContext) -> CheckResult:
    # Counted only where samples should differ (checks.samples: samplesPerPrompt > 1, temperature > 0).
    n, alike = counts.sampled_prompts, counts.identical_samples
    if n == 0:
        return CheckResult(
            name=IDENTICAL_SAMPLES, passed=True, total=0, verdict="no prompt with two samples to compare"
        )
    counted = f"{_frac(alike, n)} prompts got identical samples"
    return _rate_check(
        IDENTICAL_SAMPLES,
        alike,
        n,
        ctx.thresholds.max_identical_sample_rate,
        "prompts with two or more samples",
        counted if alike else f"the samples of {_frac(n, n)} prompts differ",
        counted,
        IDENTICAL_SAMPLES_FIX,
    )


def _server_errors(counts: Counts, ctx: CheckContext) -> CheckResult:
    # Only requests the server refused: prompts set aside unsent (malformed, too long) never reached it.
    total, refused = counts.records + counts.refused, counts.refused
    return _rate_check(
        SERVER_ERRORS,
        refused,
        total,
        ctx.thresholds.max_error_rate,
        "requests",
        f"{_frac(refused, total)} requests rejected by the server",
        f"{_frac(refused, total)} requests rejected by the server (HTTP 4xx)",
        "their reasons are in rejects.jsonl",
    )


def _malformed(counts: Counts) -> CheckResult:
    n, bad = counts.lines, counts.unusable
    return _rate_check(
        MALFORMED,
        bad,
        n,
        MAX_MALFORMED_RATE,
        "dataset lines",
        f"{_frac(bad, n)} dataset lines set aside unsent (malformed or unrenderable)",
        f"{_frac(bad, n)} dataset lines are not usable prompts or cannot be rendered by the chat template",
        "check spec.dataset.path and its format (the format: docs/worker.md)",
    )


def _duplicates(counts: Counts) -> CheckResult:
    n, repeated = counts.lines, counts.duplicates
    return _rate_check(
        DUPLICATES,
        repeated,
        n,
        MAX_DUPLICATE_RATE,
        "dataset lines",
        f"{_frac(repeated, n)} dataset lines repeat an earlier line's id, set aside (the first one is generated)",
        f"{_frac(repeated, n)} dataset lines repeat an earlier line's id",
        "check that spec.dataset.idField names an id of its own on each line (without one, a line's id is its "
        "content's hash); rejects.jsonl names each repeat",
    )


def _too_long(counts: Counts) -> CheckResult:
    n, bad = counts.lines, counts.too_long
    return _rate_check(
        TOO_LONG,
        bad,
        n,
        MAX_TOO_LONG_RATE,
        "dataset lines",
        f"{_frac(bad, n)} prompts set aside unsent as too long for the server's context",
        f"{_frac(bad, n)} prompts + max_new_tokens exceed the server's context",
        "lower generation.sampling.max_new_tokens or raise the server's --context-length (where rejects.jsonl "
        "names the KV pool, give the server more KV memory: server.memFractionStatic, more GPUs)",
    )


def _server_failures(counts: Counts) -> CheckResult:
    total, bad = counts.records + counts.refused + counts.failed, counts.failed
    return _rate_check(
        SERVER_FAILURES,
        bad,
        total,
        MAX_SERVER_FAILURE_RATE,
        "requests",
        f"{_frac(bad, total)} requests ran out of attempts (5xx, timeouts)",
        f"{_frac(bad, total)} requests ran out of attempts (HTTP 5xx, timeouts, resets)",
        "the server is failing; see its log (a rerun retries them)",
    )


def _output_volume(counts: Counts) -> CheckResult:
    total, bad = counts.records + counts.unwritten, counts.unwritten
    return _rate_check(
        OUTPUT_VOLUME,
        bad,
        total,
        0.0,
        "answers",
        f"{_frac(bad, total)} answers not written to the output volume"
        if bad
        else f"every answer written to the output volume ({_frac(total, total)})",
        f"{_frac(bad, total)} answers could not be written: the output volume is full or failing",
        "free space or grow it, then resume (they are generated again)",
    )


def by_turn_words(records: Mapping[int, int], flagged: Mapping[int, int]) -> str:
    """Records by turn as a person counts them (api/words.py: 1 is the stored turn 0), the flagged ones beside:
    '1: 23 (1 flagged), 2: 21'."""
    return ", ".join(
        f"{turn + 1}: {records[turn]}" + (f" ({flagged[turn]} flagged)" if flagged.get(turn) else "")
        for turn in sorted(records)
    )
