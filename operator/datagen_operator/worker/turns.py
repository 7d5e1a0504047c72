"""A conversation's next turn (generation.turns all): after an answer is recorded, the lane that holds the
conversation has its next prompt prepared from the model's own answers (worker/turn_maker.py) and sends it, or
ends the conversation by the rules of prompts/conversation.py, each end recorded with its cause
(records.turns_reject). A conversation a crash left mid-way goes on the same way."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from datagen_operator.api.words import turn_label
from datagen_operator.engine.tool_calls import call_names
from datagen_operator.output.records import turns_reject
from datagen_operator.prompts.conversation import (
    ANSWER_CALLED_TOOL,
    ANSWER_UNFINISHED,
    EARLIER_TURN_REFUSED,
    AnswerSplit,
    calls_tool,
    finished_with_stop,
)
from datagen_operator.prompts.job import Job
from datagen_operator.worker.inputs import Inputs
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.turn_maker import TurnMaker, Unsendable


class NextTurns:
    def __init__(self, maker: TurnMaker, ledger: Ledger, inputs: Inputs) -> None:
        self.maker = maker
        """How the next turn is prepared: its messages, render and length check (worker/turn_maker.py)."""
        self.ledger = ledger
        self.inputs = inputs
        """Its splitter: how an answer becomes the next turn's history (loaded before any answer is recorded)."""

    def split(self, job: Job, output_ids: Sequence[int], finish_reason: Any) -> AnswerSplit:
        conversation = job.conversation
        variables, tools = (
            (conversation.variables, conversation.tools or ()) if conversation is not None else (None, ())
        )
        splitter = self.inputs.splitter
        assert splitter is not None, "generation.turns all loads a splitter"
        return splitter.split(output_ids, finish_reason, job.has_tools, variables, tools)

    async def after_answer(self, job: Job, split: AnswerSplit, finish_reason: Any) -> Job | None:
        """The conversation's next turn, ready to send, or None: it is done or ends here (recorded)."""
        conversation = job.conversation
        if conversation is None:
            return None
        conversation.answers.append(split)
        following = dataclasses.replace(job, turn=job.turn + 1, input_ids=[])
        if following.turn >= len(conversation.turns):
            return None
        if not finished_with_stop(finish_reason):
            kind = finish_reason.get("type") if isinstance(finish_reason, dict) else finish_reason
            self.end(following, ANSWER_UNFINISHED, f"{turn_label(job.turn)}'s answer ended with {kind!r}, not a stop")
            return None
        if calls_tool(split):
            self.end_after_call(following, split)
            return None
        return await self.rendered(following)

    def end_after_call(self, following: Job, split: AnswerSplit) -> None:
        """The answer before `following` called a tool: SGLang's chat endpoint hands the call to the client, and
        no dataset tool result answers it."""
        names = call_names(split.tool_calls)
        self.end(following, ANSWER_CALLED_TOOL, f"{turn_label(following.turn - 1)}'s answer calls a tool ({names})")

    def after_refusal(self, job: Job, status: int) -> None:
        """The server refused a turn for good: the conversation's later turns are not sent."""
        if job.conversation is not None and job.turn + 1 < len(job.conversation.turns):
            following = dataclasses.replace(job, turn=job.turn + 1, input_ids=[])
            self.end(following, EARLIER_TURN_REFUSED, f"the server refused {turn_label(job.turn)} (HTTP {status})")

    async def resumed(self, job: Job) -> Job | None:
        """A conversation a crash left mid-way at its first turn not recorded (`job.turn`, after the answers the
        store holds), ready to send, or None (it ends here, recorded)."""
        conversation = job.conversation
        assert conversation is not None
        last = conversation.answers[job.turn - 1] if job.turn else None
        if last is not None and calls_tool(last):
            # A crash between the call's record and its cut: the conversation ended at the call.
            self.end_after_call(job, last)
            return None
        return await self.rendered(job)

    async def rendered(self, job: Job) -> Job | None:
        """`job` (turn > 0, no input_ids yet) with its prompt rendered from the answers so far, or None when it
        cannot be sent (the rest of the conversation ended, recorded)."""
        ready = await self.maker.rendered(job)
        if isinstance(ready, Unsendable):
            self.end(job, ready.cause, f"{turn_label(job.turn)}: {ready.reason}")
            return None
        return ready

    def end(self, job: Job, cause: str, reason: str) -> None:
        """The conversation's sample ends before `job.turn`: its turns from there on are recorded as not sent."""
        self.ledger.cut_turns(job.id, turns_reject(job, cause, reason))
