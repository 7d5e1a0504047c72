"""The preflight's one pass over the dataset: every line read once, every prompt's first request rendered on all
the cores the pod has (the workers' RenderPool, its helpers started at once), judged by the rolling checks'
dataset rules and written to the output's rendered store (output/rendered.py), which the workers then send
as it is.

Lines stream through: memory holds a few batches in flight, the lines set aside, and a small sample of rendered
prompts for the output estimate, whatever the dataset's size.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datagen_operator.api.generation_spec import HistoryReasoning
from datagen_operator.api.progress import TOO_LONG, UNRENDERABLE, Counts
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks.evaluate import dataset_checks, measured
from datagen_operator.engine.chat_content import empty_user_messages
from datagen_operator.engine.limits import ContextLimit, too_long_reason
from datagen_operator.output.rendered import RenderedWriter
from datagen_operator.output.volume import is_volume_error
from datagen_operator.prompts.conversation import (
    Turns,
    dataset_answers,
    last_turn,
    plan_turns,
    request_messages,
    turn_messages,
)
from datagen_operator.prompts.draws import VariableDraws
from datagen_operator.prompts.lines import MalformedLine, PromptRef, prompt_from
from datagen_operator.prompts.pin import prompt_hash
from datagen_operator.prompts.render import RenderItem, RenderPool, RenderResult, ids_from_result
from datagen_operator.prompts.scan import ShardScan

BATCH = 64
"""Prompts a render helper takes at once (amortises the pickling round trip)."""
SAMPLE_PROMPTS = 64
"""Rendered prompts kept (a uniform sample) for the output estimate's token mix."""


@dataclass(frozen=True)
class DatasetLines:
    """The dataset's lines judged by the rolling checks' own dataset rules (checks.evaluate.dataset_checks)."""

    counts: Counts
    """The dataset's lines and the prompts set aside by cause."""
    checks: list[CheckResult]
    examples: str
    """The first lines of each cause (line number, id, why), for the message."""
    prompts: int
    """Valid prompts (unique ids): the run's total, as every worker's plan counts them, summed."""
    lines_total: int
    malformed: list[MalformedLine]
    """Lines that are not prompts (the scan's causes), for the dataset summary."""
    sample: list[list[int]]
    """Up to SAMPLE_PROMPTS rendered prompts, drawn uniformly."""
    mean_prompt_tokens: float
    rendered_tokens: int = 0
    """The tokens of every prompt rendered (what the rendered store holds)."""
    turns: int = 0
    """The records each sample writes, as the workers' plan counts them (worker/ledger.py): one a valid prompt, or
    with generation.turns all its conversation's planned turns (`Turns.records`), set-aside prompts too."""
    said: str = ""
    """What the preflight says of whole conversations (turns planned, cut, that may not fit), or ''."""

    @property
    def set_aside(self) -> int:
        return sum(self.counts.set_aside.values())

    @property
    def failed(self) -> str:
        return "; ".join(f"{measured(c)}: {c.verdict}" for c in self.checks if not c.passed)


@dataclass
class ConversationCounts:
    """What the preflight says of a dataset's conversations before any answer exists."""

    conversations: int = 0
    turns: int = 0
    cut: int = 0
    """User turns after a dataset tool message: never regenerated (prompts/conversation.py)."""
    may_not_fit: int = 0
    first_may_not_fit: str = ""
    trailing: int = 0
    """turns: last: lines ending with an assistant turn, which is dropped (the model answers the last user turn)."""
    empty_user: int = 0
    """Lines holding a user message with no text: sent as SGLang's chat endpoint sends one (engine/chat_content.py)."""
    first_empty_user: str = ""

    def count(self, turns: Turns) -> None:
        self.conversations += 1
        self.turns += len(turns)
        self.cut += turns.cut

    def last_turn_rendered(self, where: str, result: RenderResult, too_long: Callable[[int], str | None]) -> None:
        """A conversation's last turn rendered with the dataset's own answers standing in for the model's (which
        do not exist yet): whether it would still fit the context. A render error says nothing (the dataset's
        answers are only stand-ins; the workers render the model's)."""
        if isinstance(result, str):
            return
        reason = too_long(len(result) // 4)
        if reason is not None:
            self.may_not_fit += 1
            self.first_may_not_fit = self.first_may_not_fit or f"{where}: {reason}"

    def said(self) -> str:
        parts = []
        if self.conversations:
            parts.append(f"{plural(self.turns, 'user turn')} to answer in {plural(self.conversations, 'conversation')}")
        if self.cut:
            parts.append(f"{plural(self.cut, 'user turn')} after a tool message not regenerated (docs/regenerate.md)")
        if self.may_not_fit:
            parts.append(
                f"{plural(self.may_not_fit, 'conversation')} may not fit all their turns (with the dataset's own answers as "
                f"history, e.g. {self.first_may_not_fit}): a turn that does not fit is set aside as too_long when the "
                "workers reach it, and its conversation ends there"
            )
        if self.empty_user:
            parts.append(
                f"{plural(self.empty_user, 'line')} {agrees(self.empty_user, 'holds', 'hold')} an empty user message (e.g. {self.first_empty_user}): it is sent as "
                "it is, an empty user turn, and answered, as SGLang's chat endpoint answers it"
            )
        if self.trailing:
            parts.append(
                f"{plural(self.trailing, 'line')} {agrees(self.trailing, 'ends', 'end')} with an assistant turn: it is dropped and the model answers the last user "
                "turn (generation.turns: all regenerates every turn)"
            )
        return "; ".join(parts)


class RenderedStore:
    """The output's rendered store as the pass writes it. A volume that cannot take it (full, read-only) ends it,
    and the workers render themselves: the records' own room is the room verdict's to judge, not this."""

    def __init__(self, writer: RenderedWriter | None) -> None:
        self.writer = writer

    @classmethod
    def begin(cls, output: Path) -> RenderedStore:
        try:
            return cls(RenderedWriter(output))
        except OSError as error:
            if not is_volume_error(error):
                raise
            return cls(None)

    def add(self, position: int, line_hash: int, ids: bytes | None) -> None:
        if self.writer is None:
            return
        try:
            self.writer.add(position, line_hash, ids)
        except OSError as error:
            self._given_up(error)

    def disagrees_with(self, pin: Any) -> str:
        """'' when every line the pass hashed has the pin's hash (both read the same bytes), else which line did
        not: the dataset changed between the two reads."""
        if self.writer is None:
            return ""
        hashed = self.writer.line_hashes()
        if len(hashed) > pin.lines:
            return f"{plural(pin.lines, 'line')}, then {len(hashed)}"
        differ = np.flatnonzero((hashed != 0) & (pin.line_hashes[: len(hashed)] != hashed))
        return f"line {int(differ[0]) + 1} edited" if len(differ) else ""

    def finish(self, pin: Any, identity: dict[str, Any], start: dict[str, Any] | None = None) -> None:
        if self.writer is None:
            return
        try:
            self.writer.finish(pin.lines, identity, pin.sha256, start)
        except OSError as error:
            self._given_up(error)

    def abandon(self) -> None:
        if self.writer is not None:
            self.writer.abandon()
            self.writer = None

    def _given_up(self, error: OSError) -> None:
        if not is_volume_error(error):
            raise error
        self.abandon()


@dataclass
class _Entry:
    """A valid line in a batch: its ref and line hash; with turns all its conversation's turns (and whether its
    last turn's render follows its first's), else whether the line ends with the dataset's answer."""

    ref: PromptRef
    line_hash: int
    turns: Turns | None = None
    with_last_turn: bool = False
    trailing: bool = False
    unrenderable: str | None = None
    """Why the line has nothing to render (no request in its batch): judged in its turn, so the store's lines
    stay in dataset order."""


@dataclass
class _Pass:
    """The running counts of one pass."""

    turns_mode: str
    max_new_tokens: int
    limit: ContextLimit
    store: RenderedStore
    unrenderable: list[str] = field(default_factory=list)
    too_long: list[str] = field(default_factory=list)
    unrenderable_count: int = 0
    too_long_count: int = 0
    conversations: ConversationCounts = field(default_factory=ConversationCounts)
    prompts: int = 0
    planned: int = 0
    """Records per sample the run's plan counts (DatasetLines.turns)."""
    rendered: int = 0
    rendered_tokens: int = 0
    sample: list[list[int]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def too_long_reason(self, tokens: int) -> str | None:
        return too_long_reason(tokens, self.max_new_tokens, self.limit)

    def store_line(self, position: int, line_hash: int, ids: bytes | None) -> None:
        self.store.add(position, line_hash, ids)

    def set_unrenderable(self, ref: PromptRef, line_hash: int, why: str) -> None:
        self.unrenderable_count += 1
        if len(self.unrenderable) < 2:
            self.unrenderable.append(f"line {ref.position + 1} (id {ref.id!r}): {why}")
        self.store_line(ref.position, line_hash, None)

    def take(self, entry: _Entry, result: RenderResult) -> bool:
        """A line's first request rendered: counted, stored; whether it will be sent."""
        ref = entry.ref
        if isinstance(result, str):
            self.set_unrenderable(ref, entry.line_hash, result)
            return False
        tokens = len(result) // 4
        reason = self.too_long_reason(tokens)
        if reason is not None:
            self.too_long_count += 1
            if len(self.too_long) < 2:
                self.too_long.append(f"line {ref.position + 1} (id {ref.id!r}): {reason}")
            self.store_line(ref.position, entry.line_hash, None)
            return False
        self.store_line(ref.position, entry.line_hash, result)
        if entry.turns is not None:
            self.conversations.count(entry.turns)
        self.conversations.trailing += entry.trailing
        self.rendered += 1
        self.rendered_tokens += tokens
        # A uniform sample of the rendered prompts (reservoir), for the output estimate.
        if len(self.sample) < SAMPLE_PROMPTS:
            self.sample.append(ids_from_result(result))
        else:
            slot = self.rng.randrange(self.rendered)
            if slot < SAMPLE_PROMPTS:
                self.sample[slot] = ids_from_result(result)
        return True


async def judge_dataset(
    scan: ShardScan, turns_mode: str, max_new_tokens: int, limit: ContextLimit, pool: RenderPool,
    store: RenderedStore, *, history_reasoning: HistoryReasoning, draws: VariableDraws | None = None,
) -> DatasetLines:  # fmt: skip
    """Every valid prompt rendered as the worker renders it: lines that are not prompts or that the template
    cannot render (`malformed`), and prompts whose tokens + max_new_tokens exceed the model's context
    (`too_long`), out of the dataset's lines. The workers judge too_long again against the running server's
    own limit (its KV pool may be smaller). Rendered prompts go to `store` in dataset order."""
    run = _Pass(turns_mode, max_new_tokens, limit, store)
    batches = _Batches(run, pool)
    malformed: list[MalformedLine] = []
    entries: list[_Entry] = []
    items: list[RenderItem] = []
    for index, item in enumerate(scan):
        if index % 1024 == 1023:
            await asyncio.sleep(0)  # let finished batches be taken meanwhile
        if isinstance(item, MalformedLine):
            malformed.append(item)
            continue
        entries.append(_entry(run, *item, items, history_reasoning, draws))
        if len(entries) >= BATCH:
            await batches.send(entries, items)
            entries, items = [], []
    if entries:
        await batches.send(entries, items)
    await batches.drain(0)
    return _judged_lines(run, malformed, scan.lines_total)


def _entry(
    run: _Pass, ref: PromptRef, obj: dict[str, Any], items: list[RenderItem], history_reasoning: HistoryReasoning,
    draws: VariableDraws | None,
) -> _Entry:  # fmt: skip
    """A valid line counted in the plan, its requests to render added to `items`: its first (every turns mode)
    and, for a conversation of two turns or more, its last on the dataset's own answers."""
    run.prompts += 1
    prompt = prompt_from(ref, obj, draws)
    entry = _Entry(ref, prompt_hash(obj))
    if empty_user_messages(prompt.messages):
        run.conversations.empty_user += 1
        run.conversations.first_empty_user = run.conversations.first_empty_user or (
            f"line {ref.position + 1} (id {ref.id!r})"
        )
    if run.turns_mode != "all":
        run.planned += 1
        entry.trailing = last_turn(prompt.messages)[1] > 0
        messages = request_messages(prompt.messages, run.turns_mode, history_reasoning=history_reasoning)
        items.append((messages, prompt.tools, prompt.variables))
        return entry
    turns = plan_turns(prompt.messages)
    run.planned += turns.records  # the plan's count: set-aside conversations too (worker/ledger.py)
    if not len(turns):
        entry.unrenderable = "no user message to answer"
    else:
        entry.turns = turns
        first = turn_messages(turns, 0, (), history_reasoning=history_reasoning)
        items.append((first, prompt.tools, prompt.variables))
    if len(turns) >= 2:
        stand_ins = dataset_answers(prompt.messages, turns)
        history = turn_messages(turns, len(turns) - 1, stand_ins, history_reasoning=history_reasoning)
        items.append((history, prompt.tools, prompt.variables))
        entry.with_last_turn = True
    return entry


class _Batches:
    """The batches sent to the render helpers, a few in flight, taken in dataset order."""

    def __init__(self, run: _Pass, pool: RenderPool) -> None:
        self.run, self.pool = run, pool
        self.ahead: deque[tuple[list[_Entry], asyncio.Future[list[RenderResult]]]] = deque()
        self.max_ahead = 2 * max(1, pool.processes) + 1

    async def send(self, entries: list[_Entry], items: list[RenderItem]) -> None:
        self.ahead.append((entries, asyncio.ensure_future(self.pool.render(items))))
        await self.drain(self.max_ahead - 1)

    async def drain(self, until: int) -> None:
        run = self.run
        while len(self.ahead) > until:
            batch, future = self.ahead.popleft()
            results = iter(await future)
            for entry in batch:
                if entry.unrenderable is not None:
                    run.set_unrenderable(entry.ref, entry.line_hash, entry.unrenderable)
                    continue
                accepted = run.take(entry, next(results))
                if entry.with_last_turn:
                    last = next(results)
                    if accepted:
                        where = f"line {entry.ref.position + 1} (id {entry.ref.id!r})"
                        run.conversations.last_turn_rendered(where, last, run.too_long_reason)


def _judged_lines(run: _Pass, malformed: list[MalformedLine], lines_total: int) -> DatasetLines:
    causes = Counter(line.cause for line in malformed) + Counter(
        {UNRENDERABLE: run.unrenderable_count, TOO_LONG: run.too_long_count}
    )
    counts = Counts(lines=run.prompts + len(malformed), set_aside=dict(causes))
    bad = [f"line {line.position + 1}: {line.reason}" for line in malformed[:2]]
    firsts = [*bad, *run.unrenderable, *run.too_long]
    examples = "e.g. " + "; ".join(firsts) if firsts else ""
    return DatasetLines(
        counts,
        dataset_checks(counts),
        examples,
        run.prompts,
        lines_total,
        malformed,
        run.sample,
        run.rendered_tokens / run.rendered if run.rendered else 0.0,
        run.rendered_tokens,
        run.planned,
        run.conversations.said(),
    )
