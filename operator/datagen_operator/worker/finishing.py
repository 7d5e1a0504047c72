"""Finishing a shard: the final state and exit code, compaction into Parquet, the manifest entry, and
the report of a failed output volume."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_OUTPUT_VOLUME,
)
from datagen_operator.api.progress import ShardProgress
from datagen_operator.worker.feeder import Feeder
from datagen_operator.worker.shard_files import dataset_change, record_shard

log = logging.getLogger("datagen.worker")


class Finishing(Feeder):
    async def _finish(self) -> int:
        c, p, writer = self.config, self.progress, self.writer
        if self.volume_error is None:
            self._write(writer.close)  # in this thread: a volume failure sets the worker's asyncio events
        if self.volume_error is not None:
            return await self._finish_volume_failed()
        # A drained worker does not start compacting (it could outlast the grace period); the next run does.
        complete = self.planned and not self.remaining and self.fatal is None and not self.drained
        changed = await asyncio.to_thread(dataset_change, c) if complete else None
        if changed is not None:  # edited while this shard read it: its records may mix two datasets
            log.error("%s", changed)
            code = EXIT_BAD_INPUT
            p.state, p.message = "failed", changed
        elif self.fatal is not None:
            code, message = self.fatal
            p.state, p.message = "failed", message
        elif complete:
            code = EXIT_OK
            p.state = "compacting" if c.compact else "complete"
            await self._publish(force=True)
            try:
                writer.release_reserve()  # compaction needs the room more
                result = await asyncio.to_thread(self._compact) if c.compact else None
            except OSError as error:
                from datagen_operator.output.volume import is_volume_error

                if is_volume_error(error):
                    self.volume_error = error
                    return await self._finish_volume_failed()
                code = EXIT_INCOMPLETE
                p.state, p.message = "incomplete", f"compaction failed ({error}); segments kept, rerun compacts"
                log.error("%s", p.message)
            else:
                p.state = "complete"
                p.message = p.summary_line() + (f", {result.path.name} {result.bytes} bytes" if result else "")
        elif self.drained:
            code = EXIT_DRAINED
            p.state, p.message = "drained", f"drained: {p.records_done}/{p.records_total} records; rerun resumes"
        else:
            code = EXIT_INCOMPLETE
            p.state = "incomplete"
            p.message = f"{p.records_failed} records ran out of attempts; rerun resumes them"
        self._update_manifest_shard(p)
        snapshot = self._snapshot()
        self.sinks.file.write(snapshot)
        self.sinks.display.close(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=True)
            await self.sinks.configmap.close()
        return code

    async def _finish_volume_failed(self) -> int:
        """Whole records stay, the torn rest is cut off; the cause goes out first where a full volume
        cannot hide it, then into progress.json and the manifest (written into the freed reserve)."""
        from datagen_operator.output.volume import free_bytes, volume_reason

        error, p, writer = self.volume_error, self.progress, self.writer
        assert error is not None
        writer.abort()
        free = free_bytes(self.config.output)  # what the volume had left, before the reserve is given back
        writer.release_reserve()
        self._count_from_disk(p)
        p.records_unwritten = self.unwritten
        p.failure_reason = volume_reason(error)
        p.state, p.message = "failed", self._volume_text(error, free)
        if self.unwritten:
            p.message += f" ({self.unwritten} answers could not be written and are generated again)"
        self._tell_cause(p.message)
        p.volume_path, p.volume_free_bytes = str(self.config.output), free
        snapshot = self._snapshot()
        for write in (lambda: self.sinks.file.write(snapshot), lambda: self._update_manifest_shard(p)):
            try:
                write()
            except OSError as failure:
                log.error("cannot record the failure on the volume: %s", failure)
        self.sinks.display.close(snapshot)
        if self.sinks.configmap is not None:
            await self.sinks.configmap.write(snapshot, force=True)
            await self.sinks.configmap.close()
        return EXIT_OUTPUT_VOLUME

    def _compact(self) -> Any:
        from datagen_operator.output.parquet import compact_shard
        from datagen_operator.prompts.dataset import MalformedLine, ShardScan

        c = self.config
        scan = ShardScan(c.dataset, c.shard_index, c.shard_count, c.spec.dataset.format)
        order = (
            (item[0].id, sample)
            for item in scan
            if not isinstance(item, MalformedLine)
            for sample in range(self.samples)
        )
        result = compact_shard(self.layout, self.config.shard_index, self.config.shard_count, order)
        if result.orphans:
            log.warning("%d records are not in the current dataset; kept at the end of the Parquet", result.orphans)
        self.compaction = result
        return result

    def _update_manifest_shard(self, p: ShardProgress) -> None:
        record_shard(self.layout, self.config.shard_index, p, self.compaction)
