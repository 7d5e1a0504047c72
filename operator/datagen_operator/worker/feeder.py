"""The feeder: the dataset read as requests go out, prompts rendered a few batches ahead and queued as jobs,
prompts that are never sent set aside, a line edited since the pin refused. With generation.turns all it queues
each conversation's first turn still to make; a conversation a crash left mid-way resumes from its last
recorded turn once the plan is read (its earlier answers read back from the store)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.reasons import Reason
from datagen_operator.output.readers import stored_answers
from datagen_operator.output.records import (
    UNRENDERABLE,
    ContextLimit,
    Conversation,
    Job,
    malformed_reject,
    too_long_reason,
    too_long_reject,
)
from datagen_operator.output.volume import is_volume_error
from datagen_operator.prompts.conversation import (
    NO_USER_TURN,
    Turns,
    calls_tool,
    plan_turns,
    request_messages,
    turn_messages,
)
from datagen_operator.prompts.draws import variable_draws
from datagen_operator.prompts.lines import MalformedLine, Prompt, prompt_from, source_fields
from datagen_operator.prompts.pin import changed_message, prompt_hash
from datagen_operator.prompts.render import RenderItem, RenderResult, ids_from_result, line_thinking
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.inputs import Inputs
from datagen_operator.worker.jobs import JobQueue
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.stealing import ShardWork, claims_for
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.turns import NextTurns

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("datagen.worker")

Batch = list[tuple[Prompt, int, Turns | None]]
"""Prompts to render (their first request's messages), each with its dataset line's hash (what the record
keeps) and, with turns all, its conversation's turns."""


class Feeder:
    RENDER_BATCH = 32

    def __init__(
        self,
        config: WorkerConfig,
        inputs: Inputs,
        ledger: Ledger,
        jobs: JobQueue,
        stop: Stop,
        limit: ContextLimit,
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
        self.limit = limit
        self.pinned = pinned
        """The dataset pin's line hashes (prompts/pin.py), read at start; each prompt is held to it."""
        self.turns = turns
        """generation.turns all: how a conversation's later turns are rendered."""
        self.history_reasoning = config.spec.generation.history_reasoning
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
        ledger, pinned = self.ledger, self.pinned
        ahead: deque[tuple[Batch, asyncio.Future[list[RenderResult]]]] = deque()
        max_ahead = max(2, 2 * self.inputs.render_pool.processes + 1)
        batch: Batch = []

        async def send_what_is_read() -> None:
            """Before a claim: what was read is rendered and queued, and the lanes have taken most of it, so what
            this worker holds claimed but unsent stays small (worker/stealing.py)."""
            nonlocal batch
            if batch:
                ahead.append((batch, asyncio.ensure_future(self._render(batch))))
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
                turns: Turns | None = None
                if self.turns is not None:
                    prompt = prompt_from(ref, obj, self.draws)
                    turns = plan_turns(prompt.messages)
                    if not ledger.plan_prompt(ref, max(1, len(turns)), turns.cut):
                        continue
                else:
                    if not ledger.plan_prompt(ref):
                        continue
                    prompt = prompt_from(ref, obj, self.draws)
                    # A line ending with the dataset's answer: the model answers its last user turn instead.
                    messages = request_messages(prompt.messages, "last", history_reasoning=self.history_reasoning)
                    prompt = dataclasses.replace(prompt, messages=messages)
                drawn = prompt.variables if self.draws is not None else None
                fields = source_fields(obj, self.config.spec.dataset.id_field, drawn)
                if fields is not None:
                    prompt = dataclasses.replace(prompt, source_fields=fields)
                line_hash = prompt_hash(obj)
                if pinned is not None and (ref.position >= len(pinned) or int(pinned[ref.position]) != line_hash):
                    # Edited since the pin (maybe while this run reads it): nothing from it may be sent.
                    message = changed_message(self.config.dataset, f"line {ref.position + 1} (id {ref.id!r}) edited")
                    self.stop.set_fatal(EXIT_BAD_INPUT, message, Reason.DATASET_CHANGED)
                    return
                if turns is not None and not len(turns):
                    reason = "no user message to answer (generation.turns: all answers each user turn)"
                    ledger.set_aside(prompt.id, malformed_reject(prompt.position, reason, "", prompt.id, NO_USER_TURN))
                    continue
                if turns is not None:
                    first = turn_messages(turns, 0, (), history_reasoning=self.history_reasoning)
                    prompt = dataclasses.replace(prompt, messages=first)
                batch.append((prompt, line_hash, turns))
                if len(batch) >= self.RENDER_BATCH:
                    ahead.append((batch, asyncio.ensure_future(self._render(batch))))
                    batch = []
                    while len(ahead) >= max_ahead:
                        await self._queue_rendered(*ahead.popleft())
            if batch:
                ahead.append((batch, asyncio.ensure_future(self._render(batch))))
            while ahead:
                await self._queue_rendered(*ahead.popleft())
            await self._queue_resumed()
            ledger.planned = True
            p = ledger.progress
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
            await self.jobs.end()
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

    async def _render(self, prompts: Batch) -> list[RenderResult]:
        """The batch's ids: the preflight's where it rendered the line as it is now, the rest rendered here."""
        stored = self.inputs.rendered
        found: list[RenderResult | None] = [
            stored.ids(prompt.position, line_hash) if stored else None for prompt, line_hash, _ in prompts
        ]
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:
            items: list[RenderItem] = [
                (prompts[i][0].messages, prompts[i][0].tools, prompts[i][0].variables) for i in missing
            ]
            for i, result in zip(missing, await self.inputs.render_pool.render(items), strict=True):
                found[i] = result
        return [result if result is not None else "not rendered" for result in found]

    async def _queue_rendered(self, prompts: Batch, future: asyncio.Future[list[RenderResult]]) -> None:
        results = await future
        ledger, samples = self.ledger, self.ledger.samples
        max_new_tokens = int(self.inputs.sampling["max_new_tokens"])
        for (prompt, line_hash, turns), result in zip(prompts, results, strict=True):
            if isinstance(result, str):
                ledger.set_aside(prompt.id, malformed_reject(prompt.position, result, "", prompt.id, UNRENDERABLE))
                continue
            input_ids = ids_from_result(result)
            # Checked here, before sending: SGLang would answer 400 (or cut the answer) for every sample.
            too_long = too_long_reason(len(input_ids), max_new_tokens, self.limit)
            if too_long is not None:
                ledger.set_aside(prompt.id, too_long_reject(prompt.position, prompt.id, too_long))
                continue
            has_tools = bool(prompt.tools)
            thinking = line_thinking(self.config.resolved, prompt.variables) if prompt.variables else None
            for sample in range(samples):
                if turns is None:
                    if ledger.turns_to_send(prompt.id, sample):
                        job = Job(
                            prompt.position, prompt.id, sample, input_ids, has_tools, line_hash,
                            thinking=thinking, source_fields=prompt.source_fields,
                        )  # fmt: skip
                        await self.jobs.put(job)
                    continue
                to_send = ledger.turns_to_send(prompt.id, sample, len(turns))
                if not to_send:
                    continue
                if to_send.start > 0:
                    self.resumed.append((prompt, line_hash, turns, sample, to_send.start))
                    continue
                conversation = Conversation(turns, prompt.tools, [], prompt.variables)
                job = Job(
                    prompt.position, prompt.id, sample, input_ids, has_tools, line_hash, 0, conversation, thinking,
                    prompt.source_fields,
                )  # fmt: skip
                await self.jobs.put(job)

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
            conversation = Conversation(turns, prompt.tools, [earlier[turn] for turn in range(start)], prompt.variables)
            thinking = line_thinking(self.config.resolved, prompt.variables) if prompt.variables else None
            job = Job(
                prompt.position, prompt.id, sample, [], bool(prompt.tools), line_hash, start, conversation, thinking,
                prompt.source_fields,
            )  # fmt: skip
            if start and calls_tool(earlier[start - 1]):
                # A crash between the call's record and its cut: the conversation ended at the call.
                self.turns.end_after_call(job, earlier[start - 1])
                continue
            ready = await self.turns.rendered(job)
            if ready is not None:
                await self.jobs.put(ready)
        self.resumed.clear()
