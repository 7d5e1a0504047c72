"""The feeder: the dataset read as requests go out, prompts rendered a few batches ahead and queued as jobs,
prompts that are never sent set aside, a line edited since the pin refused. With generation.turns all it queues
each conversation's first turn still to make; a conversation a crash left mid-way resumes from its last
recorded turn once the plan is read (its earlier answers read back from the store). Every request is prepared
by the turn maker (worker/turn_maker.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.reasons import Reason
from datagen_operator.output.readers import stored_answers
from datagen_operator.output.records import TOO_LONG, malformed_reject, too_long_reject
from datagen_operator.output.volume import is_volume_error
from datagen_operator.prompts.conversation import NO_USER_TURN, Turns, plan_turns
from datagen_operator.prompts.draws import variable_draws
from datagen_operator.prompts.lines import MalformedLine, Prompt, PromptRef, prompt_from, source_fields
from datagen_operator.prompts.pin import changed_message, prompt_hash
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.inputs import Inputs, InputsUnavailable
from datagen_operator.worker.jobs import JobQueue
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.stealing import ShardWork, claims_for
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.turn_maker import TurnMaker, Unsendable
from datagen_operator.worker.turns import NextTurns

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("datagen.worker")

Batch = list[tuple[Prompt, int, Turns | None]]
"""Prompts to render (their first request, `TurnMaker.first`), each with its dataset line's hash (what the record
keeps) and, with turns all, its conversation's turns."""
Rendering = tuple[Batch, "asyncio.Future[list[list[int] | Unsendable]]"]
"""A batch and its prompts' ids (or why each is never sent) as they are rendered."""


class Feeder:
    RENDER_BATCH = 32

    def __init__(
        self,
        config: WorkerConfig,
        inputs: Inputs,
        ledger: Ledger,
        jobs: JobQueue,
        stop: Stop,
        maker: TurnMaker,
        pinned: npt.NDArray[np.uint64] | None,
        turns: NextTurns | None = None,
    ) -> None:
        self.config = config
        writer = ledger.writer
        has_records = bool(len(writer.done) or len(writer.rejected) or writer.set_aside)
        self.work = ShardWork(config, inputs.plan, claims_for(config), has_records)
        """The items to feed: this shard's chunks, then other shards' (worker/stealing.py)."""
        self.inputs = inputs
        self.ledger = ledger
        self.jobs = jobs
        self.stop = stop
        self.maker = maker
        """How every request is prepared: its messages, render, length check and Job (worker/turn_maker.py)."""
        self.pinned = pinned
        """The dataset pin's line hashes (prompts/pin.py), read at start; each prompt is held to it."""
        self.turns = turns
        """generation.turns all: how a conversation's later turns are sent or end."""
        self.draws = variable_draws(config.spec.generation.template_variable_mix)
        """generation.templateVariableMix: each line's drawn variables (prompts/draws.py)."""
        self.resumed: list[tuple[Prompt, int, Turns, int, int]] = []
        """(prompt, line hash, turns, sample, first turn to make) of conversations a crash left mid-way."""

    async def feed(self) -> None:
        """Renders prompts still to do, in dataset order, a few batches ahead, and queues their jobs.

        Batches go to the render helpers concurrently; results are queued in submission order, so
        requests leave roughly in dataset order. The queue is bounded: rendering runs only as far ahead
        of the requests as the lanes can use.
        """
        ledger = self.ledger
        ahead: deque[Rendering] = deque()
        max_ahead = max(2, 2 * self.inputs.render_pool.processes + 1)
        batch: Batch = []

        async def send_what_is_read() -> None:
            """Before a claim: what was read is rendered and queued, and the lanes have taken most of it, so what
            this worker holds claimed but unsent stays small (worker/stealing.py)."""
            nonlocal batch
            if batch:
                ahead.append(self._rendering(batch))
                batch = []
            while ahead:
                await self._queue_rendered(*ahead.popleft())
            # A conversation is several requests in a row: fewer of them wait.
            conversations = self.turns is not None
            await self.jobs.wait_low(self.config.concurrency // (4 if conversations else 2))

        self.work.before_claim = send_what_is_read
        try:
            index = 0
            async for item in self.work.items():
                index += 1
                if index % 512 == 511:
                    await asyncio.sleep(0)  # reading the plan: let the lanes move answers meanwhile
                if isinstance(item, MalformedLine):
                    ledger.plan_line(item)
                    continue
                ref, obj = item
                to_do = self._to_do(ref, obj)
                if to_do is None:
                    continue
                prompt, turns = to_do
                line_hash = prompt_hash(obj)
                if self._edited(ref, line_hash):
                    return
                if turns is not None and not len(turns):
                    reason = "no user message to answer (generation.turns: all answers each user turn)"
                    ledger.set_aside(prompt.id, malformed_reject(prompt.position, reason, "", prompt.id, NO_USER_TURN))
                    continue
                batch.append((prompt, line_hash, turns))
                if len(batch) >= self.RENDER_BATCH:
                    ahead.append(self._rendering(batch))
                    batch = []
                    while len(ahead) >= max_ahead:
                        await self._queue_rendered(*ahead.popleft())
            if batch:
                ahead.append(self._rendering(batch))
            while ahead:
                await self._queue_rendered(*ahead.popleft())
            await self._queue_resumed()
            ledger.planned = True
            self._log_read()
            await self.jobs.end()
        except InputsUnavailable:
            return  # the tokenizer failed to load after the first requests: the shard is stopped (fatal)
        except OSError as error:
            if not is_volume_error(error):
                message = f"reading or rendering the dataset failed: {type(error).__name__}: {error}"
                self.stop.set_fatal(EXIT_BAD_INPUT, message, Reason.DATASET_UNUSABLE)
                raise
            self.ledger.volume.failed(error)  # a claim the output volume could not take (worker/stealing.py)
        except Exception as error:
            message = f"reading or rendering the dataset failed: {type(error).__name__}: {error}"
            self.stop.set_fatal(EXIT_BAD_INPUT, message, Reason.DATASET_UNUSABLE)
            raise
        finally:
            for _, future in ahead:
                future.cancel()

    def _to_do(self, ref: PromptRef, obj: dict[str, Any]) -> tuple[Prompt, Turns | None] | None:
        """The line's prompt and, with turns all, its conversation's turns, counted in the plan; None when
        nothing of it is left to make."""
        ledger = self.ledger
        turns: Turns | None = None
        if self.turns is not None:
            prompt = prompt_from(ref, obj, self.draws)
            turns = plan_turns(prompt.messages)
            if not ledger.plan_prompt(ref, max(1, len(turns)), turns.cut):
                return None
        else:
            if not ledger.plan_prompt(ref):
                return None
            prompt = prompt_from(ref, obj, self.draws)
        drawn = prompt.variables if self.draws is not None else None
        fields = source_fields(obj, self.config.spec.dataset.id_field, drawn)
        if fields is not None:
            prompt = dataclasses.replace(prompt, source_fields=fields)
        return prompt, turns

    def _edited(self, ref: PromptRef, line_hash: int) -> bool:
        """Whether the line was edited since the pin (maybe while this run reads it): nothing from it may be sent,
        and the shard stops (fatal)."""
        pinned = self.pinned
        if pinned is None or (ref.position < len(pinned) and int(pinned[ref.position]) == line_hash):
            return False
        message = changed_message(self.config.dataset, f"line {ref.position + 1} (id {ref.id!r}) edited")
        self.stop.set_fatal(EXIT_BAD_INPUT, message, Reason.DATASET_CHANGED)
        return True

    def _rendering(self, batch: Batch) -> Rendering:
        requests = [self.maker.first(prompt, line_hash) for prompt, line_hash, _ in batch]
        return batch, asyncio.ensure_future(self.maker.render(requests))

    async def _queue_rendered(self, batch: Batch, future: asyncio.Future[list[list[int] | Unsendable]]) -> None:
        ledger = self.ledger
        for (prompt, line_hash, turns), ids in zip(batch, await future, strict=True):
            if isinstance(ids, Unsendable):
                ledger.set_aside(prompt.id, _set_aside_entry(prompt, ids))
                continue
            for sample in range(ledger.samples):
                to_send = ledger.turns_to_send(prompt.id, sample, len(turns) if turns is not None else 1)
                if not to_send:
                    continue
                if turns is not None and to_send.start > 0:
                    self.resumed.append((prompt, line_hash, turns, sample, to_send.start))
                    continue
                await self.jobs.put(self.maker.job(prompt, line_hash, sample, ids, turns))
        self.inputs.first_queued()  # the tokenizer may load now (worker/inputs.py)

    async def _queue_resumed(self) -> None:
        """The conversations a crash left mid-way, each from its first turn not recorded, its earlier answers as
        the store holds them (their splits, recorded with each turn)."""
        if not self.resumed or self.turns is None:
            return
        wanted = {(prompt.id, sample) for prompt, _, _, sample, _ in self.resumed}
        answers = await asyncio.to_thread(stored_answers, self.config.output, self.config.shard_index, wanted)
        log.info("resuming %d conversation(s) from their last recorded turn", len(self.resumed))
        for prompt, line_hash, turns, sample, start in self.resumed:
            earlier = answers.get((prompt.id, sample), {})
            if any(turn not in earlier for turn in range(start)):
                message = f"conversation {prompt.id!r} sample {sample}: its recorded turns lost their answers"
                self.stop.set_fatal(EXIT_BAD_INPUT, message, Reason.OUTPUT_DAMAGED)
                return
            job = self.maker.job(prompt, line_hash, sample, [], turns, [earlier[turn] for turn in range(start)])
            ready = await self.turns.resumed(job)
            if ready is not None:
                await self.jobs.put(ready)
        self.resumed.clear()

    def _log_read(self) -> None:
        p = self.ledger.progress
        log.info(
            "dataset read: shard %d/%d has %d prompts (%d lines set aside, %d of them duplicates; %d chunk(s) "
            "taken from other shards, %d given)",
            p.shard,
            p.shard_count,
            p.prompts_total,
            p.malformed_lines,
            p.counts.duplicates,
            self.work.stolen,
            self.work.given,
        )


def _set_aside_entry(prompt: Prompt, why: Unsendable) -> dict[str, Any]:
    """The rejects.jsonl entry of a line whose first request is never sent: too long, or not renderable."""
    if why.cause == TOO_LONG:
        return too_long_reject(prompt.position, prompt.id, why.reason)
    return malformed_reject(prompt.position, why.reason, "", prompt.id, why.cause)
