"""The shard's ledger: its counters from what is on disk, the plan counted as the feeder reads it, and what is
left of each prompt, so progress, the final state and the manifest say exactly what the output holds."""

from __future__ import annotations

import logging
from typing import Any

from datagen_operator.api.progress import Counts, ShardProgress
from datagen_operator.api.spec import AUTO_CONCURRENCY
from datagen_operator.api.words import turn_label
from datagen_operator.output.records import TOO_LONG, UNRENDERABLE, malformed_reject, turns_entry
from datagen_operator.output.writer import ShardWriter
from datagen_operator.prompts.conversation import EARLIER_TURN_REFUSED, NO_USER_TURN, TOOL_TURN, plan_turns
from datagen_operator.prompts.lines import MalformedLine, PromptRef, line_key, prompt_from
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.progress import Tracker
from datagen_operator.worker.stealing import owned_items
from datagen_operator.worker.volume_guard import VolumeGuard

log = logging.getLogger("datagen.worker")


def start_ledger(
    config: WorkerConfig, writer: ShardWriter, volume: VolumeGuard, tracker: Tracker, recovered: int
) -> Ledger:
    """The generation's counters, from what the writer holds on disk (never from an older progress.json); the
    dataset's totals and what is left of each prompt come as the feeder reads the plan. They replace the
    start-up's progress in `tracker`."""
    c, early = config, tracker.progress
    counts = Counts()
    counts.merge(writer.summary)
    counts.merge(writer.written)
    counts.records = len(writer.done)
    p = ShardProgress(
        shard=c.shard_index,
        shard_count=c.shard_count,
        state="running",
        servers_total=len(c.servers),
        started_at=early.started_at,
        fingerprint_sha256=early.fingerprint_sha256,
        counts=counts,
    )
    counts.refused = len(writer.rejected)
    counts.records_set_aside = set_aside_on_disk(writer, c.spec.generation.samples_per_prompt)
    tracker.restart(p)
    auto = (
        " (clients.concurrency auto, as the canary sized it)" if c.spec.clients.concurrency == AUTO_CONCURRENCY else ""
    )
    log.info(
        "shard %d/%d: %d records already recorded; reading the dataset as requests go out, %d at once%s",
        c.shard_index,
        c.shard_count,
        p.records_done,
        c.concurrency,
        auto,
        extra={"fields": {"recovered_records": recovered, "concurrency": c.concurrency}},
    )
    return Ledger(config, writer, volume, p)


def set_aside_on_disk(writer: ShardWriter, samples: int) -> int:
    """Samples of the prompts set aside in the output (unrenderable, too long), counted from the start as the
    records are: a resumed worker's progress does not go backwards while it reads the dataset again."""
    aside = sum(1 for cause in writer.set_aside.values() if cause in (TOO_LONG, UNRENDERABLE, NO_USER_TURN))
    return aside * samples + writer.turns_cut_records


class Ledger:
    def __init__(self, config: WorkerConfig, writer: ShardWriter, volume: VolumeGuard, progress: ShardProgress) -> None:
        self.config = config
        self.writer = writer
        self.volume = volume
        self.progress = progress
        self.samples = config.spec.generation.samples_per_prompt
        self.remaining: dict[str, int] = {}
        """Records left per prompt id of the plan read so far (samples x turns still to make)."""
        self.planned = False
        """True once the feeder has read the whole plan (the totals are final)."""

    def plan_line(self, line: MalformedLine) -> None:
        """A dataset line this shard owns that is set aside (bad JSON, id, messages, tools, duplicate)."""
        self.writer.add_reject(malformed_reject(line.position, line.reason, line.excerpt, line.id, line.cause))
        self.progress.counts.lines += 1
        self.progress.counts.set_aside_one(line.cause)

    def plan_prompt(self, ref: PromptRef, turns: int = 1, cut: int = 0) -> bool:
        """Count one valid prompt of the plan, with the `turns` its conversation gets (`cut`: its user turns
        after a dataset tool message, never planned); True when records of it are still to generate."""
        p, writer, n = self.progress, self.writer, self.samples
        p.prompts_total += 1
        p.counts.lines += 1
        p.records_total += n * turns
        if cut:
            p.turns_cut[TOOL_TURN] = p.turns_cut.get(TOOL_TURN, 0) + cut
        cause = writer.set_aside.get(line_key(ref.position))
        if cause is not None:
            # Set aside by an earlier run (unrenderable, too long): never sent again. Its samples are counted
            # from the start (set_aside_on_disk).
            p.counts.set_aside_one(cause)
            p.counts.records_set_aside += n * (turns - 1)  # set_aside_on_disk counted one turn per sample
            p.prompts_done += 1
            return False
        for sample in range(n) if turns > 1 else ():
            refused = self.refused_uncut(ref.id, sample, turns)
            if refused is not None:  # a crash came between the refusal and its cut: the cut is written now
                reason = f"the server refused {turn_label(refused)}"
                self._record_cut(
                    turns_entry(ref.position, ref.id, sample, refused + 1, turns, EARLIER_TURN_REFUSED, reason)
                )
        left = sum(len(self.turns_to_send(ref.id, sample, turns)) for sample in range(n))
        if left:
            self.remaining[ref.id] = left
            return True
        p.prompts_done += 1
        return False

    def turns_to_send(self, prompt_id: str, sample: int, turns: int = 1) -> range:
        """The turns of (prompt, sample) still to make: a conversation resumes at its first turn not recorded,
        refused or cut (its turns go out in order, so every earlier one is recorded)."""
        writer = self.writer
        end = min(turns, writer.turns_cut.get((prompt_id, sample), turns))
        for turn in range(end):
            key = (prompt_id, sample, turn)
            if key in writer.rejected:
                return range(0)  # refused: its cut (turns_reject) follows it, or a crash came between
            if key not in writer.done:
                return range(turn, end)
        return range(0)

    def refused_uncut(self, prompt_id: str, sample: int, turns: int) -> int | None:
        """The turn the server refused whose later turns were never recorded as not sent (a crash between the
        two writes), or None."""
        writer = self.writer
        if (prompt_id, sample) in writer.turns_cut:
            return None
        for turn in range(turns - 1):
            key = (prompt_id, sample, turn)
            if key in writer.rejected:
                return turn
            if key not in writer.done:
                return None
        return None

    def cut_turns(self, prompt_id: str, entry: dict[str, Any]) -> None:
        """A conversation's sample ends before its planned turns (records.turns_reject): recorded once, its turns
        counted apart from server errors."""
        count = self._record_cut(entry)
        if count:
            self.finish_records(prompt_id, count)

    def _record_cut(self, entry: dict[str, Any]) -> int:
        """Write a turns entry and count its turns; how many (0 when it could not be written)."""
        if not self.volume.write(self.writer.add_reject, entry):
            return 0
        p, count = self.progress, int(entry["turns"]) - int(entry["turn"])
        p.turns_cut[entry["cause"]] = p.turns_cut.get(entry["cause"], 0) + count
        p.counts.records_set_aside += count
        return count

    def set_aside(self, prompt_id: str, entry: dict[str, Any]) -> None:
        """A prompt that is never sent: recorded once in rejects.jsonl, all its samples counted apart from
        server errors, the prompt done."""
        if not self.volume.write(self.writer.add_reject, entry):
            return
        p = self.progress
        p.counts.set_aside_one(entry["cause"])
        p.counts.records_set_aside += self.remaining.pop(prompt_id)
        p.prompts_done += 1

    def finish_sample(self, prompt_id: str) -> None:
        """One record made or refused for good: the prompt is done with its last."""
        self.finish_records(prompt_id, 1)

    def finish_records(self, prompt_id: str, count: int) -> None:
        left = self.remaining.get(prompt_id, 0) - count
        if left <= 0:
            self.remaining.pop(prompt_id, None)
            self.progress.prompts_done += 1
        else:
            self.remaining[prompt_id] = left

    def count_from_disk(self) -> None:
        """Set the counts and totals exactly from the disk and a whole pass over the plan (a failure's final
        report: the feeder may not have read the whole plan)."""
        c, p, writer, n = self.config, self.progress, self.writer, self.samples
        counts = p.counts
        counts.records = counts.refused = counts.lines = p.prompts_done = p.prompts_total = p.records_total = 0
        counts.set_aside = {}
        counts.records_set_aside = set_aside_on_disk(writer, n)
        self.remaining = {}
        for item in owned_items(c):
            if isinstance(item, MalformedLine):
                counts.lines += 1
                counts.set_aside_one(item.cause)
                continue
            ref, obj = item
            turns, cut = self.turns_of(ref, obj)
            if line_key(ref.position) not in writer.set_aside:
                keys = [(ref.id, sample, turn) for sample in range(n) for turn in range(turns)]
                counts.records += sum(1 for key in keys if key in writer.done)
                counts.refused += sum(1 for key in keys if key in writer.rejected)
            self.plan_prompt(ref, turns, cut)

    def turns_of(self, ref: PromptRef, obj: dict[str, Any]) -> tuple[int, int]:
        """(turns to generate, user turns cut at a tool message) of a valid dataset line."""
        if self.config.spec.generation.turns != "all":
            return 1, 0
        turns = plan_turns(prompt_from(ref, obj).messages)
        return turns.records, turns.cut
