"""Finishing a shard: the final state and exit code, compaction into Parquet, the manifest entry, and the
report of a failed output volume."""

from __future__ import annotations

import asyncio
import logging

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_OUTPUT_VOLUME,
)
from datagen_operator.api.reasons import Reason
from datagen_operator.api.words import plural
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import release_lease
from datagen_operator.output.parquet import CompactionResult, compact_shard
from datagen_operator.output.volume import free_bytes, is_volume_error, volume_reason
from datagen_operator.output.writer import ShardWriter
from datagen_operator.prompts.lines import MalformedLine
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.failure import FailureReport
from datagen_operator.worker.ledger import Ledger
from datagen_operator.worker.publisher import Publisher
from datagen_operator.worker.shard_files import dataset_change, every_shard_complete, record_shard
from datagen_operator.worker.stealing import owned_items
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.volume_guard import VolumeGuard

log = logging.getLogger("datagen.worker")


class Finisher:
    def __init__(
        self,
        config: WorkerConfig,
        layout: OutputLayout,
        writer: ShardWriter,
        ledger: Ledger,
        stop: Stop,
        volume: VolumeGuard,
        publisher: Publisher,
        failure: FailureReport,
    ) -> None:
        self.config = config
        self.layout = layout
        self.writer = writer
        self.ledger = ledger
        self.stop = stop
        self.volume = volume
        self.publisher = publisher
        self.failure = failure
        self.compaction: CompactionResult | None = None

    async def finish(self) -> int:
        c, ledger, stop, writer = self.config, self.ledger, self.stop, self.writer
        p = ledger.progress
        if self.volume.error is None:
            self.volume.write(writer.close)  # in this thread: a volume failure sets the worker's asyncio events
        if self.volume.error is not None:
            return await self._finish_volume_failed(self.volume.error)
        if self.volume.known_full is not None:  # no request went out after: those in flight are written
            return await self._finish_volume_failed(self.volume.known_full)
        # A drained worker does not start compacting (it could outlast the grace period); the next run does.
        complete = ledger.planned and not ledger.remaining and stop.fatal is None and not stop.drained
        changed = await asyncio.to_thread(dataset_change, c) if complete else None
        cause = Reason.WORKERS_FAILED  # records out of attempts, a failed compaction: a rerun resumes them
        if changed is not None:  # edited while this shard read it: its records may mix two datasets
            log.error("%s", changed)
            code = EXIT_BAD_INPUT
            cause = Reason.DATASET_CHANGED
            p.state, p.message, p.failure_reason = "failed", changed, cause
        elif stop.fatal is not None:
            code, message, cause = stop.fatal
            p.state, p.message, p.failure_reason = "failed", message, cause
        elif complete:
            code = EXIT_OK
            p.state = "compacting" if c.compact else "complete"
            await self.publisher.publish(force=True)
            try:
                writer.release_reserve()  # compaction needs the room more
                result = await asyncio.to_thread(self._compact) if c.compact else None
            except OSError as error:
                if is_volume_error(error):
                    self.volume.error = error
                    return await self._finish_volume_failed(error)
                code = EXIT_INCOMPLETE
                p.state, p.message = "incomplete", f"compaction failed ({error}); segments kept, rerun compacts"
                log.error("%s", p.message)
            else:
                p.state = "complete"
                p.message = p.summary_line() + (f", {result.path.name} {result.bytes} bytes" if result else "")
        elif stop.drained:
            code, cause = EXIT_DRAINED, Reason.DRAINED
            p.state, p.message = "drained", f"drained: {p.records_done}/{p.records_total} records; rerun resumes"
        else:
            code = EXIT_INCOMPLETE
            p.state = "incomplete"
            p.message = f"{plural(p.counts.failed, 'record')} ran out of attempts; rerun resumes them"
        if code != EXIT_OK:
            self.failure.tell_cause(cause, p.message)
        self._record_shard()
        snapshot = self.publisher.snapshot()
        self.publisher.sinks.file.write(snapshot)
        await self.publisher.close(snapshot)
        return code

    async def _finish_volume_failed(self, error: OSError) -> int:
        """Whole records stay, the torn rest is cut off; the cause goes out first where a full volume cannot
        hide it, then into progress.json and the manifest (written into the freed reserve)."""
        ledger, writer, unwritten = self.ledger, self.writer, self.volume.unwritten
        p = ledger.progress
        writer.abort()
        free = free_bytes(self.config.output)  # what the volume had left, before the reserve is given back
        writer.release_reserve()
        if volume_reason(error) == Reason.OUTPUT_VOLUME_FULL:
            self.volume.tell_peers()  # in the room the reserve gave back, before they fill it with answers
        ledger.count_from_disk()
        p.counts.unwritten = unwritten
        p.failure_reason = reason = volume_reason(error)
        p.state, p.message = "failed", self.failure.volume_text(error, free)
        if unwritten:
            p.message += f" ({plural(unwritten, 'answer')} could not be written and are generated again)"
        self.failure.tell_cause(reason, p.message)
        p.volume_path, p.volume_free_bytes = str(self.config.output), free
        snapshot = self.publisher.snapshot()

        def write_progress() -> None:
            self.publisher.sinks.file.write(snapshot)

        for write in (write_progress, self._record_shard):
            try:
                write()
            except OSError as failure:
                log.error("cannot record the failure on the volume: %s", failure)
        await self.publisher.close(snapshot)
        return EXIT_OUTPUT_VOLUME

    def _compact(self) -> CompactionResult:
        c, samples = self.config, self.ledger.samples
        scan = owned_items(c)  # the chunks it claimed, its own shard's and others'
        turns_of = self.ledger.turns_of
        order = (
            (item[0].id, sample, turn)
            for item in scan
            if not isinstance(item, MalformedLine)
            for sample in range(samples)
            for turn in range(turns_of(*item)[0])
        )
        result = compact_shard(self.layout, c.shard_index, c.shard_count, order)
        if result.orphans:
            log.warning("%d records are not in the current dataset; kept at the end of the Parquet", result.orphans)
        self.compaction = result
        return result

    def _record_shard(self) -> None:
        c = self.config
        manifest = record_shard(self.layout, c.shard_index, self.ledger.progress, self.compaction)
        if c.lease_holder is not None and every_shard_complete(manifest, c.shard_count):
            # The run's last shard is done: nothing more is written here, so another run may take the output
            # now rather than when the lease lapses (no shard renews it any more).
            release_lease(c.output, c.lease_holder)
