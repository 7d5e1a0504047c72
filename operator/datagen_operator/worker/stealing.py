"""What this worker generates, chunk by chunk (output/steal.py): its own shard's chunks, claimed as the feeder
reaches them; then the other shards' chunks it claimed in an earlier run (it finishes them, keyed by its own
records); then, with stealing on, other shards' unclaimed chunks from their end, the shard that has made the
fewest records first (its progress.json), until no chunk is left unclaimed anywhere. A chunk is claimed only once
the worker's queue is low (`before_claim`), so what it holds claimed but unsent stays about one round of its
requests: what the last chunks of a run can leave uneven between workers. Every item goes through the feeder's
one path (the pin's line hashes, the preflight's rendered ids, the set-aside rules), and its records into this
worker's shard files.

One shard alone claims nothing: there is nobody to share with."""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson

from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.steal import CHUNK_LINES, CONVERSATION_CHUNK_LINES, Claims, chunk_of
from datagen_operator.prompts.lines import MalformedLine, PromptRef
from datagen_operator.prompts.scan import ShardScan
from datagen_operator.worker.config import WorkerConfig

log = logging.getLogger("datagen.worker")

Item = tuple[PromptRef, dict[str, Any]] | MalformedLine
"""One item of a shard's plan: a valid prompt (with its parsed object) or a line set aside."""

STASH_CHUNKS = 32
"""Chunks of a victim kept at hand from one read of its plan (the largest unclaimed ones it saw, 512 items):
a steal after the first costs a claim, not a read of the dataset."""

YIELD_EVERY = 512
"""Items read between two returns to the event loop while a victim's plan is read (its other lines skipped)."""


def claims_for(config: WorkerConfig) -> Claims | None:
    """The output's claims (their chunk size settled), or None for a run of one shard."""
    if config.shard_count == 1:
        return None
    conversations = config.spec.generation.turns == "all"
    claims = Claims(config.output, CONVERSATION_CHUNK_LINES if conversations else CHUNK_LINES)
    claims.settle()
    return claims


def shard_scan(config: WorkerConfig, shard: int) -> ShardScan:
    return ShardScan(config.dataset_ref, shard, config.shard_count)


class ShardWork:
    """The feeder's items, in the order above (`items`); `stolen` counts the chunks taken from other shards."""

    def __init__(self, config: WorkerConfig, plan: ShardScan, claims: Claims | None, has_records: bool) -> None:
        self.config = config
        self.plan = plan
        self.claims = claims
        self.has_records = has_records
        """This shard's files held records (or set-aside lines) when the worker started."""
        self.before_claim: Callable[[], Awaitable[None]] | None = None
        """Awaited before each claim: the feeder sends what it has read and waits for its queue to be low."""
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
        if self.has_records and claims.owner(me, 0) != me and not claims.closed(me):
            # Records but no claim of its first chunk: an output begun before claims (an owner claims its first
            # chunk before it records anything). Its chunks cannot say what it made, so nobody else takes them.
            await asyncio.to_thread(claims.close, me)
            log.warning("shard %d: its output began without claims; other shards will not take its chunks", me)
        mine = False
        for index, item in enumerate(self.plan):
            if index % claims.chunk_lines == 0:
                # Claimed (durably) before any prompt of the chunk is queued; a chunk another worker holds is
                # its: skipped here, counted there.
                owner = await self._claim(me, chunk_of(index, claims.chunk_lines))
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

    async def _claim(self, shard: int, chunk: int) -> int:
        assert self.claims is not None
        if self.claims.owner(shard, chunk) is None and self.before_claim is not None:
            await self.before_claim()
        return await asyncio.to_thread(self.claims.claim, shard, chunk, self.me)

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
        left = [shard for shard in range(self.config.shard_count) if shard != me]
        """Shards that may still have unclaimed chunks (once all of a shard's are claimed, they stay claimed)."""
        stash: dict[int, dict[int, list[Item]]] = {}
        """shard -> chunk -> items, of chunks that were unclaimed when its plan was read."""
        while left:
            victim = min(left, key=self._records_done)
            if not self._may_take(victim):
                left.remove(victim)
                continue
            claimed = claims.claimed(victim)
            chunks = stash.setdefault(victim, {})
            for chunk in [chunk for chunk in chunks if chunk in claimed]:
                del chunks[chunk]  # claimed since
            if not chunks:
                chunks = stash[victim] = await self._stash(victim)
                if not chunks:
                    left.remove(victim)
                    continue
            chunk = max(chunks)
            items = chunks.pop(chunk)
            if await self._claim(victim, chunk) != me:
                continue
            self.stolen += 1
            log.info("took chunk %d of shard %d (%d lines)", chunk, victim, len(items))
            for item in items:
                yield item

    def _may_take(self, shard: int) -> bool:
        """Whether `shard`'s chunks may be taken: not closed, and not an output begun before claims whose worker
        has not come back to close it (records in its files, its first chunk not claimed by it)."""
        claims = self.claims
        assert claims is not None
        if claims.closed(shard):
            return False
        return claims.owner(shard, 0) == shard or not _holds_records(self.config, shard)

    def _records_done(self, shard: int) -> int:
        """What `shard` has recorded by its last progress.json (-1: none yet, so it has done the least)."""
        try:
            return int(orjson.loads(OutputLayout(self.config.output).progress(shard).read_bytes())["records_done"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    async def _stash(self, shard: int) -> dict[int, list[Item]]:
        """Read `shard`'s plan for the items of its largest chunks unclaimed now."""
        assert self.claims is not None
        lines, claimed = self.claims.chunk_lines, self.claims.claimed(shard)
        kept: dict[int, list[Item]] = {}
        for index, item in enumerate(shard_scan(self.config, shard)):
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            chunk = chunk_of(index, lines)
            if chunk in claimed:
                continue
            kept.setdefault(chunk, []).append(item)
            if len(kept) > STASH_CHUNKS:
                del kept[min(kept)]
        return kept


def _holds_records(config: WorkerConfig, shard: int) -> bool:
    """Whether `shard`'s files hold a record or a set-aside line (a worker's fresh segment is empty)."""
    layout = OutputLayout(config.output)
    if any(layout.data_dir.glob(f"shard-{shard:05d}-of-*.parquet")):
        return True
    files = [*layout.segments(shard), layout.rejects(shard)]
    return any(path.exists() and path.stat().st_size > 0 for path in files)


def owned_items(config: WorkerConfig) -> Iterator[Item]:
    """This worker's items as the claims stand, in dataset order, claiming nothing: the chunks of its own shard
    it claimed and those of other shards (compaction's row order, a failure's recount)."""
    claims = claims_for(config)
    if claims is None:
        yield from shard_scan(config, config.shard_index)
        return
    held = claims.held(config.shard_index, config.shard_count)
    parts = [_claimed_by_me(config, claims, config.shard_index, None)]
    parts += [_claimed_by_me(config, claims, shard, set(chunks)) for shard, chunks in sorted(held.items())]
    yield from heapq.merge(*parts, key=_position)


def _claimed_by_me(config: WorkerConfig, claims: Claims, shard: int, chunks: set[int] | None) -> Iterator[Item]:
    """The items of `shard` in `chunks` (None: those of its chunks this worker claimed)."""
    lines, mine = claims.chunk_lines, False
    for index, item in enumerate(shard_scan(config, shard)):
        if index % lines == 0:
            chunk = chunk_of(index, lines)
            mine = chunk in chunks if chunks is not None else claims.owner(shard, chunk) == config.shard_index
        if mine:
            yield item


def _position(item: Item) -> int:
    return item.position if isinstance(item, MalformedLine) else item[0].position
