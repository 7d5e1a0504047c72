"""The plan and the feeder: counters from what is on disk, the dataset read as requests go out, prompts
rendered a few batches ahead and queued as jobs, prompts that are never sent set aside."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.progress import RecordCounts, ShardProgress
from datagen_operator.output.records import (
    TOO_LONG,
    UNRENDERABLE,
    ContextLimit,
    Job,
    malformed_reject,
    too_long_reason,
    too_long_reject,
)
from datagen_operator.worker.progress import Tracker
from datagen_operator.worker.publishing import Publishing

log = logging.getLogger("datagen.worker")


class Feeder(Publishing):
    def _init_progress(self, recovered: int) -> None:

        c, writer = self.config, self.writer
        # Counts from what the writer holds on disk (never from an older progress.json); the dataset's
        # totals and what is left of each prompt come as the feeder reads the plan (`_plan_prompt`).
        counts = RecordCounts()
        counts.merge(writer.summary)
        counts.merge(writer.written)
        counts.records = len(writer.done)
        p = ShardProgress(
            shard=c.shard_index,
            shard_count=c.shard_count,
            state="running",
            servers_total=len(c.servers),
            started_at=self.progress.started_at,
            fingerprint_sha256=self.progress.fingerprint_sha256,
            counts=counts,
            records_rejected=len(writer.rejected),
            records_set_aside=self._set_aside_on_disk(),
        )
        self.remaining, self.planned = {}, False
        self.progress = p
        self.tracker = Tracker(p)
        log.info(
            "shard %d/%d: %d records already recorded; reading the dataset as requests go out",
            c.shard_index,
            c.shard_count,
            p.records_done,
            extra={"fields": {"recovered_records": recovered}},
        )

    def _set_aside_on_disk(self) -> int:
        """Samples of the prompts set aside in the output (unrenderable, too long), counted from the start as
        the records are: a resumed worker's progress does not go backwards while it reads the dataset again."""
        aside = sum(1 for cause in self.writer.set_aside.values() if cause in (TOO_LONG, UNRENDERABLE))
        return aside * self.samples

    def _plan_line(self, line: Any) -> None:
        """A dataset line this shard owns that is set aside (bad JSON, id, messages, tools, duplicate)."""
        p = self.progress
        self.writer.add_reject(malformed_reject(line.position, line.reason, line.excerpt, line.id, line.cause))
        p.prompts_malformed += 1
        p.set_aside[line.cause] = p.set_aside.get(line.cause, 0) + 1

    def _plan_prompt(self, ref: Any) -> bool:
        """Count one valid prompt of the plan; True when samples of it are still to generate."""
        p, writer, n = self.progress, self.writer, self.samples
        p.prompts_total += 1
        p.records_total += n
        cause = writer.set_aside.get(f"line:{ref.position}")
        if cause is not None:
            # Set aside by an earlier run (unrenderable, too long): never sent again. Written before causes
            # existed, an unrenderable prompt's entry says only "malformed" (its samples are counted here, not
            # from the start: only here is the line known to be a prompt).
            if cause not in (TOO_LONG, UNRENDERABLE):
                p.records_set_aside += n
            cause = TOO_LONG if cause == TOO_LONG else UNRENDERABLE
            if cause == TOO_LONG:
                p.prompts_too_long += 1
            else:
                p.prompts_rejected += 1
            p.set_aside[cause] = p.set_aside.get(cause, 0) + 1
            p.prompts_done += 1
            return False
        left = sum(
            1 for sample in range(n) if (ref.id, sample) not in writer.done and (ref.id, sample) not in writer.rejected
        )
        if left:
            self.remaining[ref.id] = left
            return True
        p.prompts_done += 1
        return False

    def _count_from_disk(self, p: Any) -> None:
        """Set p's counts and totals exactly from the disk and a whole pass over the plan (a failure's
        final report: the feeder may not have read the whole plan)."""
        from datagen_operator.prompts.dataset import MalformedLine, ShardScan

        c, writer, n = self.config, self.writer, self.samples
        p.records_done = p.records_rejected = p.records_set_aside = p.prompts_done = 0
        p.prompts_total = p.records_total = p.prompts_malformed = p.prompts_rejected = p.prompts_too_long = 0
        p.set_aside = {}
        p.records_set_aside = self._set_aside_on_disk()
        self.remaining = {}
        for item in ShardScan(c.dataset, c.shard_index, c.shard_count, c.spec.dataset.format):
            if isinstance(item, MalformedLine):
                p.prompts_malformed += 1
                p.set_aside[item.cause] = p.set_aside.get(item.cause, 0) + 1
                continue
            ref = item[0]
            if f"line:{ref.position}" not in writer.set_aside:
                p.records_done += sum(1 for sample in range(n) if (ref.id, sample) in writer.done)
                p.records_rejected += sum(1 for sample in range(n) if (ref.id, sample) in writer.rejected)
            self._plan_prompt(ref)

    RENDER_BATCH = 32

    async def _feed(self, queue: asyncio.Queue[Any]) -> None:
        """Renders prompts still to do, in dataset order, a few batches ahead, and queues their jobs.

        Batches go to the render helpers concurrently; results are queued in submission order, so
        requests leave roughly in dataset order. The queue is bounded: rendering runs only as far ahead
        of the requests as the lanes can use.
        """
        from collections import deque

        from datagen_operator.prompts.dataset import MalformedLine, prompt_from
        from datagen_operator.prompts.pin import changed_message, prompt_hash

        n = self.samples
        pinned = self.pinned
        ahead: deque[tuple[list[Any], asyncio.Future[list[Any]]]] = deque()
        max_ahead = max(2, 2 * self.inputs.render_pool.processes + 1)
        try:
            batch: list[Any] = []
            for index, item in enumerate(self.inputs.plan):
                if index % 512 == 511:
                    await asyncio.sleep(0)  # reading the plan: let the lanes move answers meanwhile
                if isinstance(item, MalformedLine):
                    self._plan_line(item)
                    continue
                ref, obj = item
                if not self._plan_prompt(ref):
                    continue
                line_hash = prompt_hash(obj)
                if pinned is not None and (ref.position >= len(pinned) or int(pinned[ref.position]) != line_hash):
                    # Edited since the pin (maybe while this run reads it): nothing from it may be sent.
                    message = changed_message(self.config.dataset, f"line {ref.position + 1} (id {ref.id!r}) edited")
                    self._set_fatal(EXIT_BAD_INPUT, message)
                    return
                batch.append((prompt_from(ref, obj), line_hash))
                if len(batch) >= self.RENDER_BATCH:
                    ahead.append((batch, asyncio.ensure_future(self._render(batch))))
                    batch = []
                    while len(ahead) >= max_ahead:
                        await self._queue_rendered(queue, *ahead.popleft(), n)
            if batch:
                ahead.append((batch, asyncio.ensure_future(self._render(batch))))
            while ahead:
                await self._queue_rendered(queue, *ahead.popleft(), n)
            self.planned = True
            p = self.progress
            log.info(
                "dataset read: shard %d/%d has %d prompts (%d malformed lines set aside)",
                p.shard,
                p.shard_count,
                p.prompts_total,
                p.prompts_malformed,
            )
            for _ in range(self.config.spec.clients.concurrency):
                await queue.put(None)  # one end marker per lane, after the last job
        except Exception as error:
            self._set_fatal(EXIT_BAD_INPUT, f"reading or rendering the dataset failed: {type(error).__name__}: {error}")
            raise
        finally:
            for _, future in ahead:
                future.cancel()

    async def _render(self, prompts: list[Any]) -> list[Any]:
        return await self.inputs.render_pool.render([(prompt.messages, prompt.tools) for prompt, _ in prompts])

    async def _queue_rendered(
        self, queue: asyncio.Queue[Any], prompts: list[Any], future: asyncio.Future[list[Any]], n: int
    ) -> None:
        from datagen_operator.prompts.render import ids_from_result

        results = await future
        writer = self.writer
        limit: ContextLimit = self.context_limit
        max_new_tokens = int(self.inputs.sampling["max_new_tokens"])
        for (prompt, line_hash), result in zip(prompts, results, strict=True):
            if isinstance(result, str):
                self._set_aside(prompt.id, malformed_reject(prompt.position, result, "", prompt.id, UNRENDERABLE))
                continue
            input_ids = ids_from_result(result)
            # Checked here, before sending: SGLang would answer 400 (or cut the answer) for every sample.
            too_long = too_long_reason(len(input_ids), max_new_tokens, limit)
            if too_long is not None:
                self._set_aside(prompt.id, too_long_reject(prompt.position, prompt.id, too_long))
                continue
            has_tools = bool(prompt.tools)
            for sample in range(n):
                key = (prompt.id, sample)
                if key not in writer.done and key not in writer.rejected:
                    await queue.put(Job(prompt.position, prompt.id, sample, input_ids, has_tools, line_hash))

    def _set_aside(self, prompt_id: str, entry: dict[str, Any]) -> None:
        """A prompt that is never sent: recorded once in rejects.jsonl, all its samples counted apart from
        server errors, the prompt done."""
        if not self._write(self.writer.add_reject, entry):
            return
        p, cause = self.progress, entry["cause"]
        if cause == TOO_LONG:
            p.prompts_too_long += 1
        else:
            p.prompts_rejected += 1
        p.set_aside[cause] = p.set_aside.get(cause, 0) + 1
        p.records_set_aside += self.remaining.pop(prompt_id)
        p.prompts_done += 1
