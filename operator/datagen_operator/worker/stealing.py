"""What this worker generates, chunk by chunk (output/steal.py): its own shard's chunks, claimed as the feeder
reaches them; then the other shards' chunks it claimed in an earlier run (it finishes them, keyed by its own
records); then, with stealing on, other shards' unclaimed chunks from their end, the shard with the most left
first, until no chunk is left unclaimed anywhere. Every item goes through the feeder's one path (the pin's line
hashes, the preflight's rendered ids, the set-aside rules), and its records into this worker's shard files.

One shard alone claims nothing: there is nobody to share with."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from datagen_operator.output.steal import Claims, chunk_of, chunks_for
from datagen_operator.prompts.dataset import MalformedLine, PromptRef, ShardScan
from datagen_operator.worker.config import WorkerConfig

log = logging.getLogger("datagen.worker")

Item = tuple[PromptRef, dict[str, Any]] | MalformedLine
"""One item of a shard's plan: a valid prompt (with its parsed object) or a line set aside."""

STASH_CHUNKS = 4
"""Chunks of a victim kept at hand from one read of its plan (the largest unclaimed ones it saw): a steal
after the first costs a claim, not a read of the dataset."""

YIELD_EVERY = 512
"""Items read between two returns to the event loop while a victim's plan is read (its other lines skipped)."""


def claims_for(config: WorkerConfig) -> Claims | None:
    """The output's claims, or None for a run of one shard."""
    return Claims(config.output) if config.shard_count > 1 else None


def shard_scan(config: WorkerConfig, shard: int) -> ShardScan:
    c = config
    return ShardScan(c.dataset, shard, c.shard_count, c.spec.dataset.format, id_field=c.spec.dataset.id_field)


class ShardWork:
    """The feeder's items, in the order above (`items`); `stolen` counts the chunks taken from other shards."""

    def __init__(self, config: WorkerConfig, plan: ShardScan, claims: Claims | None) -> None:
        self.config = config
        self.plan = plan
        self.claims = claims
        self.me = config.shard_index
        self.stolen = 0
        """Chunks this run claimed from other shards."""
        self.given = 0
        """Chunks of this shard that another worker had claimed (skipped here)."""

    async def items(self) -> AsyncIterator[Item]:
        claims, me = self.claims, self.me
        if claims is None:
            for item in self.plan:
                yield item
            return
        mine = False
        for index, item in enumerate(self.plan):
            if index % claims.chunk_lines == 0:
                # Claimed (durably) before any prompt of the chunk is queued; a chunk another worker holds is
                # its: skipped here, counted there.
                owner = await asyncio.to_thread(claims.claim, me, chunk_of(index, claims.chunk_lines), me)
                mine = owner == me
                self.given += not mine
            if mine:
                yield item
        if self.given:
            log.info("shard %d: %d chunk(s) of %d lines were taken by other shards", me, self.given, claims.chunk_lines)
        held = await asyncio.to_thread(claims.held, me, self.config.shard_count)
        for shard, chunks in sorted(held.items()):
            log.info("finishing %d chunk(s) of shard %d claimed earlier", len(chunks), shard)
            async for item in self._read(shard, set(chunks)):
                yield item
        if self.config.steal:
            async for item in self._steal():
                yield item

    async def _read(self, shard: int, chunks: set[int]) -> AsyncIterator[Item]:
        """The items of `chunks` of `shard`, in order."""
        assert self.claims is not None
        lines = self.claims.chunk_lines
        for index, item in enumerate(shard_scan(self.config, shard)):
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            if chunk_of(index, lines) in chunks:
                yield item

    async def _steal(self) -> AsyncIterator[Item]:
        claims, me = self.claims, self.me
        assert claims is not None
        others = [shard for shard in range(self.config.shard_count) if shard != me]
        counts: dict[int, int] = {}
        """shard -> its chunks, learned by reading its plan."""
        stash: dict[int, dict[int, list[Item]]] = {}
        """shard -> chunk -> items, of chunks that were unclaimed when its plan was read."""
        while True:
            for shard in others:
                if shard not in counts:
                    await self._stash(shard, counts, stash)
            left = {shard: self._unclaimed(shard, counts[shard]) for shard in others}
            victim = max(others, key=lambda shard: len(left[shard]))
            if not left[victim]:
                return
            chunks = stash.setdefault(victim, {})
            for chunk in [chunk for chunk in chunks if chunk not in left[victim]]:
                del chunks[chunk]  # claimed since
            if not chunks:
                await self._stash(victim, counts, stash)
                continue
            chunk = max(chunks)
            items = chunks.pop(chunk)
            owner = await asyncio.to_thread(claims.claim, victim, chunk, me)
            if owner != me:
                continue
            self.stolen += 1
            log.info("took chunk %d of shard %d (%d lines)", chunk, victim, len(items))
            for item in items:
                yield item

    def _unclaimed(self, shard: int, count: int) -> set[int]:
        assert self.claims is not None
        return set(range(count)) - self.claims.claimed(shard)

    async def _stash(self, shard: int, counts: dict[int, int], stash: dict[int, dict[int, list[Item]]]) -> None:
        """Read `shard`'s plan: its chunk count, and the items of its largest chunks unclaimed now."""
        assert self.claims is not None
        lines, claimed = self.claims.chunk_lines, self.claims.claimed(shard)
        kept: dict[int, list[Item]] = {}
        items = 0
        for index, item in enumerate(shard_scan(self.config, shard)):
            items = index + 1
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            chunk = chunk_of(index, lines)
            if chunk in claimed:
                continue
            kept.setdefault(chunk, []).append(item)
            if len(kept) > STASH_CHUNKS:
                del kept[min(kept)]
        counts[shard] = chunks_for(items, lines)
        stash[shard] = kept


def owned_items(config: WorkerConfig) -> Iterator[Item]:
    """This worker's items as the claims stand, in the feeder's order, claiming nothing: the chunks of its own
    shard it claimed, then those of other shards (compaction's order, a failure's recount)."""
    claims = claims_for(config)
    if claims is None:
        yield from shard_scan(config, config.shard_index)
        return
    me, lines = config.shard_index, claims.chunk_lines
    mine = False
    for index, item in enumerate(shard_scan(config, me)):
        if index % lines == 0:
            mine = claims.owner(me, chunk_of(index, lines)) == me
        if mine:
            yield item
    for shard, chunks in sorted(claims.held(me, config.shard_count).items()):
        held = set(chunks)
        for index, item in enumerate(shard_scan(config, shard)):
            if chunk_of(index, lines) in held:
                yield item
