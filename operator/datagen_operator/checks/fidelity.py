"""Prompt fidelity, `datagen verify`'s proof that the stored input_ids are what the run's tokenizer and template
render: for one answer a line, a sample of prompts re-rendered as the workers sent them; for regenerated
conversations (generation.turns all), every turn of the sampled conversations rebuilt from the dataset's user
turns and the run's own recorded answers, and every recorded answer split equal to the split of its output_ids as
SGLang's chat endpoint makes it (prompts/conversation.py). A template that re-renders history differently, or a
split that drifted from the ids, fails here with the turn named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.generation_spec import HistoryReasoning
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import agrees, plural, turn_label
from datagen_operator.engine.tool_calls import ParsedCall, call_names
from datagen_operator.prompts.conversation import (
    AnswerSplit,
    AnswerSplitter,
    calls_tool,
    plan_turns,
    request_messages,
    turn_messages,
)

PROMPT_FIDELITY = "prompt_fidelity"


def unprovable(renderer: Any, prompts: dict[str, Any]) -> CheckResult | None:
    """Why nothing can be re-rendered (no tokenizer, no dataset), as the failed check; None when it can."""
    if renderer is None:
        return CheckResult(
            name=PROMPT_FIDELITY,
            passed=False,
            verdict="no tokenizer to re-render with: pass --tokenizer (or --no-fidelity)",
        )
    if not prompts:
        return CheckResult(
            name=PROMPT_FIDELITY,
            passed=False,
            verdict="no dataset to re-render from: pass --dataset (or --no-fidelity)",
        )
    return None


def proved(compared: int, verdict: str) -> CheckResult:
    """The passed check over `compared` re-rendered prompts."""
    return CheckResult(name=PROMPT_FIDELITY, passed=True, rate=0.0, threshold=0.0, total=compared, verdict=verdict)


CONVERSATION_COLUMNS = (
    "input_ids", "output_ids", "finish_reason", "has_tools", "answer_content", "answer_reasoning", "answer_tool_calls",
)  # fmt: skip
"""What `conversation_fidelity` reads of each record of a sampled conversation (besides id, sample and turn)."""

Conversations = dict[tuple[str, int], list[dict[str, Any]]]
"""(id, sample) -> its records in turn order, `finish_reason` decoded (steps/verify_reads.conversation_records)."""


def conversations_wanted(sampled: list[dict[str, Any]], prompts: dict[str, Any]) -> set[tuple[str, int]]:
    """The (id, sample) of the sampled records whose prompts are known: the conversations to rebuild."""
    return {(record["id"], record["sample"]) for record in sampled if record["id"] in prompts}


def conversation_fidelity(
    conversations: Conversations,
    prompts: dict[str, Any],
    renderer: Any,
    resolved: ResolvedModel | None,
    variables: dict[str, Any] | None,
    history_reasoning: HistoryReasoning,
) -> CheckResult:
    cannot = unprovable(None if resolved is None or variables is None else renderer, prompts)
    if cannot is not None:
        return cannot
    assert resolved is not None and variables is not None
    splitter = AnswerSplitter(
        renderer.tokenizer, resolved.reasoning_parser, renderer.chat_template, variables, resolved.tool_call_parser
    )
    compared = _TurnsCompared(renderer, splitter, history_reasoning)
    for (prompt_id, sample), records in sorted(conversations.items()):
        compared.conversation(f"{prompt_id!r}#{sample}", prompts[prompt_id], records)
    return compared.verdict(len(conversations))


@dataclass
class _TurnsCompared:
    """Each sampled conversation's turns rebuilt from the run's own recorded answers, and what differed (each
    turn named)."""

    renderer: Any
    splitter: AnswerSplitter
    history_reasoning: HistoryReasoning
    compared: int = 0
    prompt_differ: list[str] = field(default_factory=list)
    split_differ: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    after_call: list[str] = field(default_factory=list)

    def conversation(self, named: str, prompt: Any, records: list[dict[str, Any]]) -> None:
        """One conversation's records in turn order against its prompt's planned turns."""
        from datagen_operator.output.records import stored_split

        turns = plan_turns(prompt.messages)
        answers: list[AnswerSplit] = []
        called: tuple[ParsedCall, ...] | None = None
        for record in records:
            turn = record.get("turn") or 0
            where = f"{named} {turn_label(turn)}"
            if turn != len(answers) or turn >= len(turns):
                self.gaps.append(where)  # a turn recorded without the one before it, or beyond the plan
                break
            self.compared += 1
            sent = turn_messages(turns, turn, answers, history_reasoning=self.history_reasoning)
            fresh = self.renderer.render(sent, prompt.tools, prompt.variables)
            if list(record["input_ids"]) != fresh:
                self.prompt_differ.append(where)
            if called is not None:
                # The answer before this turn called a tool: the conversation ended there, so this turn's history
                # holds an answer the model never gave (its call dropped).
                self.after_call.append(f"{where} ({turn_label(turn - 1)} called {call_names(called)})")
            stored = stored_split(record)
            has_tools = bool(record["has_tools"])
            recomputed = self.splitter.split(
                record["output_ids"], record["finish_reason"], has_tools, prompt.variables, prompt.tools or ()
            )
            if record["answer_content"] is None or stored != recomputed:
                self.split_differ.append(where)
            answers.append(stored)
            called = recomputed.tool_calls if calls_tool(recomputed) else None

    def verdict(self, conversations: int) -> CheckResult:
        compared, prompt_differ, split_differ = self.compared, self.prompt_differ, self.split_differ
        after_call, gaps = self.after_call, self.gaps
        problems = []
        if prompt_differ:
            problems.append(
                f"{len(prompt_differ)}/{compared} turns' stored input_ids differ from their prompt rebuilt from the run's "
                f"own earlier answers (e.g. {', '.join(prompt_differ[:3])}): the tokenizer or chat template changed since "
                "generation, or the template renders history differently from what was sent"
            )
        if split_differ:
            problems.append(
                f"{len(split_differ)}/{compared} recorded answer splits differ from the split of their output_ids "
                f"(e.g. {', '.join(split_differ[:3])}): the history sent with the next turn is not what SGLang's chat "
                "endpoint would have given a client"
            )
        if after_call:
            problems.append(
                f"{plural(len(after_call), 'turn')} {agrees(len(after_call), 'was', 'were')} generated after an answer that called a tool (e.g. "
                f"{', '.join(after_call[:3])}): no dataset tool result answers the model's own call, and the history sent "
                "instead holds an answer the model never gave"
            )
        if gaps:
            problems.append(
                f"{plural(len(gaps), 'conversation')} {agrees(len(gaps), 'has', 'have')} a turn recorded without the one before it (e.g. {gaps[:3]})"
            )
        if problems:
            count = len(prompt_differ) + len(split_differ) + len(gaps) + len(after_call)
            return CheckResult(
                name=PROMPT_FIDELITY,
                passed=False,
                rate=count / max(compared, 1),
                threshold=0.0,
                count=count,
                total=compared,
                verdict="; ".join(problems),
            )
        return proved(
            compared,
            f"{plural(compared, 'turn')} of {plural(conversations, 'sampled conversation')} re-render to the stored input_ids "
            "from the run's own recorded answers, each answer split as SGLang's chat endpoint splits its output_ids",
        )


def line_fidelity(
    sampled: list[dict[str, Any]], prompts: dict[str, Any], renderer: Any, history_reasoning: HistoryReasoning
) -> CheckResult:
    """One answer a line: each sampled record's prompt rendered again as the workers sent it."""
    cannot = unprovable(renderer, prompts)
    if cannot is not None:
        return cannot
    differ: list[str] = []
    compared = 0
    for record in sampled:
        prompt = prompts.get(record["id"])
        if prompt is None:
            continue
        compared += 1
        # As the workers sent it: one answer a line answers its last user turn (a trailing assistant turn dropped).
        sent = request_messages(prompt.messages, "last", history_reasoning=history_reasoning)
        fresh = renderer.render(sent, prompt.tools, prompt.variables)
        if list(record["input_ids"]) != fresh:
            differ.append(record["id"])
    if differ:
        return CheckResult(
            name=PROMPT_FIDELITY,
            passed=False,
            rate=len(differ) / compared,
            threshold=0.0,
            count=len(differ),
            total=compared,
            verdict=f"stored input_ids differ from a fresh render in {len(differ)}/{compared} sampled records (e.g. {differ[:3]}): "
            "the tokenizer or chat template changed since generation; training must use the recorded template",
        )
    return proved(compared, f"{compared} sampled prompts re-render to the stored input_ids")
