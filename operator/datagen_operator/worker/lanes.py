"""The lanes: `concurrency` of them each take the next job, send it to /generate, and record the answer
(checked, encoded, written through) or the server's refusal. A lane that took a conversation's turn keeps the
conversation: it sends each next turn as soon as the answer before it is recorded (worker/turns.py), so the
turns go out in order and no lane waits on another's conversation."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

import orjson

from datagen_operator.api.exit_codes import EXIT_FINGERPRINT_MISMATCH, EXIT_SERVER_UNREACHABLE
from datagen_operator.api.reasons import Reason
from datagen_operator.checks.record_checks import inspect_record
from datagen_operator.checks.samples import SampleComparison, compared_samples
from datagen_operator.engine.client.generate import GenerateClient, Reply
from datagen_operator.engine.client.policy import Drained, EndpointsRejected, GaveUp, Rejected, ServerUnreachable
from datagen_operator.engine.requests import generate_body
from datagen_operator.engine.wire import WireIds
from datagen_operator.output.records import Answer, build_record, encode_record, server_reject
from datagen_operator.output.writer import ShardWriter
from datagen_operator.prompts.conversation import AnswerSplit
from datagen_operator.prompts.job import Job
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.inputs import Inputs, InputsUnavailable
from datagen_operator.worker.jobs import JobQueue
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.turns import NextTurns
from datagen_operator.worker.volume_guard import VolumeGuard

log = logging.getLogger("datagen.worker")


class Lanes:
    def __init__(
        self,
        config: WorkerConfig,
        inputs: Inputs,
        client: GenerateClient,
        jobs: JobQueue,
        writer: ShardWriter,
        ledger: Ledger,
        stop: Stop,
        volume: VolumeGuard,
        turns: NextTurns | None = None,
    ) -> None:
        self.inputs = inputs
        self.turns = turns
        compared = compared_samples(config.spec)
        self.samples = SampleComparison(compared) if compared else None
        """This run's samples of each prompt, compared as they come back (the identical-samples check)."""
        self.client = client
        self.jobs = jobs
        self.writer = writer
        self.ledger = ledger
        self.stop = stop
        self.volume = volume
        self.first_sent = False
        holder = config.lease_holder
        self.run_id = holder.id if holder is not None else None
        """The run named in each record: the holder of the output's lease (output/lease.py)."""

    async def lane(self) -> None:
        """One lane: takes the next job, sends it, records it, repeats."""
        client, sampling, stop, volume = self.client, self.inputs.sampling, self.stop, self.volume
        job: Job | None = None
        while True:
            if job is None:
                job = await self.jobs.get()
            if job is None or stop.stop_new.is_set():
                return
            sending, job = job, None
            if not volume.may_send():  # the volume is known full: nothing sent now could be stored
                return
            if not self.first_sent:
                self._say_first()
            try:
                reply = await client.generate(
                    generate_body(sending.input_ids, sampling, sample=sending.sample, stream=client.stream),
                    # A conversation's turns stay on the server whose radix cache holds their history.
                    None if self.turns is None else (sending.id, sending.sample),
                )
            except Rejected as rejected:
                if volume.error is not None or not await self._may_write():
                    return
                self._rejected(sending, rejected)
                if self.turns is not None:
                    self.turns.after_refusal(sending, rejected.status or 0)
                continue
            except GaveUp as gave_up:
                log.warning("record %s#%d failed: %s", sending.id, sending.sample, gave_up.reason)
                self.ledger.progress.counts.failed += 1
                continue
            except Drained:
                return
            except ServerUnreachable as error:
                stop.set_fatal(EXIT_SERVER_UNREACHABLE, str(error), Reason.SERVER_UNREACHABLE)
                return
            except EndpointsRejected as error:
                stop.set_fatal(EXIT_FINGERPRINT_MISMATCH, f"no usable server: {error}", Reason.FINGERPRINT_MISMATCH)
                return
            if not await self._may_write():
                return
            if volume.error is not None:
                volume.unwritten += 1  # finished on the server as the volume failed: nowhere to keep it
                return
            split = self._record(sending, reply)
            if split is not None and self.turns is not None:
                meta = reply.meta_info
                job = await self.turns.after_answer(sending, split, meta.get("finish_reason"))

    def _say_first(self) -> None:
        """Said once, as the first request goes out: what start-up loaded before it (worker/inputs.py)."""
        self.first_sent = True
        loaded = self.inputs.tokenized is not None
        imported = "transformers" in sys.modules
        log.info(
            "first request: %.2fs after the worker started, the tokenizer %s",
            time.time() - self.ledger.progress.started_at,
            "loaded" if loaded else "loading after it (the preflight's rendered prompts go first)",
            extra={"fields": {"first_request": True, "tokenizer_loaded": loaded, "transformers_imported": imported}},
        )

    async def _may_write(self) -> bool:
        """An answer sent before the tokenizer was loaded waits here, in memory, for the Expectations it is checked
        by and for the store's ids to be held to the tokenizer (worker/inputs.py); False: they failed, nothing from
        those requests is written (the shard is stopped)."""
        if self.inputs.tokenized is not None:
            return True
        try:
            await self.inputs.ready()
        except InputsUnavailable:
            return False
        return True

    def _record(self, job: Job, reply: Reply) -> AnswerSplit | None:
        """Check, encode and buffer one answer (synchronous: nothing here waits). A conversation's answer comes
        back split as its next turn's history holds it, once written."""
        meta = reply.meta_info
        flags = inspect_record(
            job.input_ids,
            reply.output_ids,
            meta.get("finish_reason"),
            meta.get("completion_tokens"),
            job.has_tools,
            self.inputs.expect_for(job.thinking),
            meta.get("num_retractions"),
        )
        answer = Answer(reply.output_ids, meta, reply.server, reply.attempts, reply.latency_s, time.time())
        split = None
        if job.conversation is not None and self.turns is not None:
            split = self.turns.split(job, reply.output_ids, meta.get("finish_reason"))
        record = build_record(job, answer, flags, self.run_id, split)
        writer, line = self.writer, encode_record(record, reply.output_ids_json)
        self.volume.largest_record = max(self.volume.largest_record, len(line))
        writer.append(record, line)
        # Written through at once (one write(), no fsync): a kill then loses only the requests in flight,
        # never answers held back in memory (they would be generated again on resume).
        if not self.volume.write(writer.flush):
            return None
        p = self.ledger.progress
        p.counts.add(len(job.input_ids), len(reply.output_ids), meta.get("cached_tokens") or 0, flags, job.has_tools)
        if job.conversation is not None:
            turn = str(job.turn)
            p.records_by_turn[turn] = p.records_by_turn.get(turn, 0) + 1
            if flags:
                p.flagged_by_turn[turn] = p.flagged_by_turn.get(turn, 0) + 1
        if self.samples is not None and job.turn == 0:
            self._compare(self.samples, job.id, reply.output_ids)
        self.ledger.finish_sample(job.id)
        return split

    def _compare(self, samples: SampleComparison, prompt_id: str, output_ids: Sequence[int]) -> None:
        # Compact JSON either way: the server's own bytes, or the same form from a list.
        raw = output_ids.raw if isinstance(output_ids, WireIds) else orjson.dumps(list(output_ids))
        alike = samples.add(prompt_id, raw)
        if alike is not None:
            counts = self.ledger.progress.counts
            counts.sampled_prompts += 1
            counts.identical_samples += alike

    def _rejected(self, job: Job, rejected: Rejected) -> None:
        entry = server_reject(job, rejected.status or 0, rejected.reason, rejected.server, rejected.attempts)
        if not self.volume.write(self.writer.add_reject, entry):
            return
        self.ledger.progress.counts.refused += 1
        self.ledger.finish_sample(job.id)
