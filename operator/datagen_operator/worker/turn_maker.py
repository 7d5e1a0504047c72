"""Every request of a shard prepared one way: a line's first request (its conversation's turn 0 under
generation.turns all, its one answer under `last`), a conversation a crash left mid-way at its first turn not
recorded, and turn k after an answer. The messages (prompts/conversation.py), the render, the server's length rule
(engine/limits.py), the line's thinking switch and the Job are each decided here; what a turn that cannot be sent
ends is the caller's (a line set aside by the feeder, a conversation cut by worker/turns.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from datagen_operator.engine.limits import ContextLimit, too_long_reason
from datagen_operator.output.records import TOO_LONG, UNRENDERABLE
from datagen_operator.prompts.conversation import AnswerSplit, Turns, request_messages, turn_messages
from datagen_operator.prompts.job import Conversation, Job
from datagen_operator.prompts.lines import Prompt
from datagen_operator.prompts.render import RenderItem, RenderResult, ids_from_result, line_thinking
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.inputs import Inputs


@dataclass(frozen=True, slots=True)
class Request:
    """A turn's prompt before it is rendered: the line it comes from (the preflight's rendering of a line's first
    request is found by its position and hash) and what the chat template renders."""

    position: int
    line_hash: int
    turn: int
    item: RenderItem


@dataclass(frozen=True, slots=True)
class Unsendable:
    """Why a turn's prompt is never sent: its cause (UNRENDERABLE, TOO_LONG) and the reason in words."""

    cause: str
    reason: str


class TurnMaker:
    def __init__(self, config: WorkerConfig, inputs: Inputs, limit: ContextLimit) -> None:
        self.resolved = config.resolved
        self.turns_mode = config.spec.generation.turns
        self.history_reasoning = config.spec.generation.history_reasoning
        self.inputs = inputs
        self.limit = limit
        self.max_new_tokens = int(inputs.sampling["max_new_tokens"])

    def first(self, prompt: Prompt, line_hash: int) -> Request:
        """A line's first request, as generation.turns has it (`request_messages`)."""
        messages = request_messages(prompt.messages, self.turns_mode, history_reasoning=self.history_reasoning)
        return Request(prompt.position, line_hash, 0, (messages, prompt.tools, prompt.variables))

    def following(self, job: Job) -> Request:
        """A conversation's turn `job.turn`, from the model's answers so far."""
        conversation = job.conversation
        assert conversation is not None
        messages = turn_messages(
            conversation.turns, job.turn, conversation.answers, history_reasoning=self.history_reasoning
        )
        return Request(job.position, job.prompt_hash, job.turn, (messages, conversation.tools, conversation.variables))

    async def render(self, requests: Sequence[Request]) -> list[list[int] | Unsendable]:
        """Each request's prompt ids, or why it is never sent: a line's first request as the preflight rendered it
        where it rendered the line as it is now, the rest rendered here; each held to the server's length rule.
        InputsUnavailable: the tokenizer, needed here, failed to load (the shard is stopped)."""
        stored = self.inputs.rendered
        found: list[RenderResult | None] = [
            stored.ids(request.position, request.line_hash) if stored and request.turn == 0 else None
            for request in requests
        ]
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:
            await self.inputs.ready()  # rendering needs the tokenizer (worker/inputs.py)
            rendered = await self.inputs.render_pool.render([requests[i].item for i in missing])
            for i, result in zip(missing, rendered, strict=True):
                found[i] = result
        checked = [self._checked(result if result is not None else "not rendered") for result in found]
        if self.inputs.tokenized is None and any(isinstance(ids, Unsendable) for ids in checked):
            await self.inputs.ready()  # a line set aside is written: not before the store is held to the tokenizer
        return checked

    def _checked(self, result: RenderResult) -> list[int] | Unsendable:
        if isinstance(result, str):
            return Unsendable(UNRENDERABLE, result)
        input_ids = ids_from_result(result)
        # Checked here, before sending: SGLang would answer 400 (or cut the answer) for every sample.
        too_long = too_long_reason(len(input_ids), self.max_new_tokens, self.limit)
        return Unsendable(TOO_LONG, too_long) if too_long is not None else input_ids

    async def rendered(self, job: Job) -> Job | Unsendable:
        """`job` (a conversation's turn, no input_ids yet) with its prompt rendered, or why it is never sent."""
        [ids] = await self.render([self.following(job)])
        return ids if isinstance(ids, Unsendable) else dataclasses.replace(job, input_ids=ids)

    def job(
        self,
        prompt: Prompt,
        line_hash: int,
        sample: int,
        input_ids: list[int],
        turns: Turns | None = None,
        answers: Sequence[AnswerSplit] = (),
    ) -> Job:
        """A (line, sample)'s first request to make: turn 0, or with `answers` (the turns a crash left recorded)
        the conversation's next; `turns`: its conversation's (generation.turns all)."""
        # A line's own thinking switch (its chat_template_kwargs): its records are judged by it.
        thinking = line_thinking(self.resolved, prompt.variables) if prompt.variables else None
        conversation = None if turns is None else Conversation(turns, prompt.tools, list(answers), prompt.variables)
        return Job(
            prompt.position, prompt.id, sample, input_ids, bool(prompt.tools), line_hash, len(answers), conversation,
            thinking, prompt.source_fields,
        )  # fmt: skip
