"""`datagen verify`'s one pass over the stored records, in columns (checks/record_columns.py): each record's flags
recomputed from its token ids and counted, its key hashed for completeness, its prompt hash held to the dataset pin,
a few examples of each flag, a uniform sample for prompt fidelity, and each prompt's samples compared
(checks/samples.py). Pure: Arrow batches in (the caller reads them, output/readers.py), the pass's result out.
"""

from __future__ import annotations

from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.progress import Counts
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.completeness import TurnCounts, sorted_unique
from datagen_operator.checks.record_columns import batch_flags
from datagen_operator.checks.samples import SampleComparison

EXAMPLES_PER_FLAG = 3
CONTEXT_TOKENS = 12
"""Tokens shown on each side of the think boundary in an example."""


@dataclass
class Example:
    id: str
    sample: int
    flag: str
    excerpt: str


def excerpt(tokenizer: Any, input_ids: list[int], output_ids: list[int], think_end_id: int | None) -> str:
    """The prompt's tail and the output around the think end, decoded with special tokens SHOWN."""
    if tokenizer is None:
        return f"prompt tail ids {input_ids[-CONTEXT_TOKENS:]} | output ids {output_ids[: 2 * CONTEXT_TOKENS]}"
    tail = tokenizer.decode(input_ids[-CONTEXT_TOKENS:], skip_special_tokens=False)
    if think_end_id is not None and think_end_id in output_ids:
        at = output_ids.index(think_end_id)
        around = output_ids[max(0, at - CONTEXT_TOKENS) : at + CONTEXT_TOKENS]
        body = tokenizer.decode(around, skip_special_tokens=False)
        prefix = "…" if at > CONTEXT_TOKENS else ""
    else:
        body = tokenizer.decode(output_ids[: 2 * CONTEXT_TOKENS], skip_special_tokens=False)
        prefix = ""
    suffix = (
        tokenizer.decode(output_ids[-4:], skip_special_tokens=False) if len(output_ids) > 2 * CONTEXT_TOKENS else ""
    )
    return f"…{tail!r} ⟶ {prefix}{body!r}" + (f" … {suffix!r}" if suffix else "")


def _compare_samples(batch: Any, comparison: SampleComparison) -> None:
    """Each first-turn record's output ids, as bytes, to `comparison` (no Python list per record)."""
    import numpy as np
    import pyarrow.compute as pc

    outputs = batch.column("output_ids")
    ends = np.cumsum(pc.list_value_length(outputs).fill_null(0).to_numpy(zero_copy_only=False))
    flat = pc.list_flatten(outputs).to_numpy(zero_copy_only=False)
    turns = batch.column("turn").fill_null(0).to_numpy(zero_copy_only=False)
    start = 0
    for prompt_id, end, turn in zip(batch.column("id").to_pylist(), ends.tolist(), turns.tolist(), strict=True):
        if turn == 0:
            comparison.add(prompt_id, flat[start:end].tobytes())
        start = end


def _compared(comparison: SampleComparison | None) -> Counts:
    if comparison is None:
        return Counts()
    comparison.close()
    return comparison.counts()


def _batch_counts(batch: Any, flags: Counter[str]) -> Counts:
    """Counts.add over a batch: token counts are list lengths, a missing cached count is 0."""
    import pyarrow.compute as pc

    def total(values: Any) -> int:
        return int(pc.sum(values).as_py() or 0)

    return Counts(
        records=batch.num_rows,
        tool_records=total(batch.column("has_tools").cast("int64")),
        prompt_tokens=total(pc.list_value_length(batch.column("input_ids"))),
        output_tokens=total(pc.list_value_length(batch.column("output_ids"))),
        cached_tokens=total(batch.column("cached_tokens")),
        flags=flags,
    )


class _FidelitySample:
    """A uniform sample of `size` records without replacement (the `size` smallest of a random key per
    record, drawn from a fixed seed in record order: the same report for the same output, however it is
    batched); only the sampled records' ids and input_ids become Python objects."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.size = size
        self._rng = np.random.default_rng(0)
        self._kept: list[tuple[float, dict[str, Any]]] = []

    def offer(self, batch: Any) -> None:
        import numpy as np

        if not self.size:
            return
        keys = self._rng.random(batch.num_rows)
        bound = self._kept[-1][0] if len(self._kept) >= self.size else 2.0
        rows = np.flatnonzero(keys < bound)
        rows = rows[np.argsort(keys[rows], kind="stable")[: self.size]]
        if not len(rows):
            return
        chosen = batch.select(["id", "sample", "turn", "input_ids"]).take(rows).to_pylist()
        self._kept = sorted([*self._kept, *zip(keys[rows].tolist(), chosen, strict=True)], key=lambda kept: kept[0])
        del self._kept[self.size :]

    def records(self) -> list[dict[str, Any]]:
        return [record for _, record in self._kept]


@dataclass
class RecordsPass:
    records: int
    counts: Counts
    keys: Any
    """np.ndarray: the records' key hashes, unique, sorted."""
    duplicates: int
    """Rows repeating an earlier (id, sample, turn): a shard's Parquet rows, and a key two shards stored (a chunk
    generated by two workers, output/steal.py)."""
    examples: dict[str, list[Example]]
    fidelity_sample: list[dict[str, Any]]
    prompts: set[int]
    """hash(id) of the prompts the records name (only when asked: counted without the dataset)."""
    by_turn: TurnCounts = field(default_factory=lambda: TurnCounts())


@dataclass
class PinCheck:
    """Every record's `prompt_hash` against the pinned hash of its dataset line (prompts/pin.py)."""

    pinned: Any
    """np.ndarray of line hashes, or None (no pin)."""
    checked: int = 0
    differ: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, batch: Any) -> None:
        import numpy as np

        if self.pinned is None:
            return
        # A record names its line 1-based (prompts.lines.line_number); the pin is indexed from 0.
        lines = batch.column("line").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) - 1
        hashes = batch.column("prompt_hash").fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
        inside = (lines >= 0) & (lines < len(self.pinned))
        pinned = np.zeros(len(lines), np.uint64)
        pinned[inside] = self.pinned[lines[inside]]
        bad = np.flatnonzero(~inside | (pinned != hashes))
        self.checked += len(lines)
        self.differ += len(bad)
        if len(bad) and len(self.examples) < 5:
            ids = batch.column("id").take(bad[: 5 - len(self.examples)]).to_pylist()
            self.examples += [f"{i!r} (line {int(lines[b]) + 1})" for i, b in zip(ids, bad.tolist(), strict=False)]


def read_records(
    batches: Any,
    pins: PinCheck,
    expect: rc.Expectations,
    tokenizer: Any,
    *,
    fidelity_size: int,
    name_prompts: bool,
    compared_samples: int = 0,
) -> RecordsPass:
    """One pass over the records (RecordBatches), checked in columns (record_columns); the samples of each
    prompt compared when `compared_samples` is 2 or more (checks.samples)."""
    import numpy as np

    counts = Counts()
    comparison = SampleComparison(compared_samples) if compared_samples > 1 else None
    record_keys = array("q")
    prompts: set[int] = set()
    examples: dict[str, list[Example]] = defaultdict(list)
    fidelity_sample = _FidelitySample(fidelity_size)
    by_turn = TurnCounts()
    for batch in batches:
        ids = batch.column("id").to_pylist()
        turns = batch.column("turn").fill_null(0).to_pylist()
        record_keys.extend(map(hash, zip(ids, batch.column("sample").to_pylist(), turns, strict=True)))
        if name_prompts:
            prompts.update(map(hash, ids))
        flags = batch_flags(batch, expect)
        counts.merge(_batch_counts(batch, flags.counts()))
        by_turn.add(turns, flags)
        pins.add(batch)
        for flag in sorted(flags.counts()):
            wanted = EXAMPLES_PER_FLAG - len(examples[flag])
            if wanted > 0:
                for r in batch.take(flags.rows_with(flag)[:wanted]).to_pylist():
                    text = excerpt(tokenizer, r["input_ids"], r["output_ids"], expect.think_end_id)
                    examples[flag].append(Example(r["id"], r["sample"], flag, text))
        fidelity_sample.offer(batch)
        if comparison is not None:
            _compare_samples(batch, comparison)
    counts = counts + _compared(comparison)
    keys = sorted_unique(np.frombuffer(record_keys, dtype=np.int64))
    # A shard's own repeats are dropped by the reader (counted there); what repeats across shards is counted here.
    duplicates = batches.duplicates + len(record_keys) - len(keys)
    return RecordsPass(
        len(record_keys), counts, keys, duplicates, examples, fidelity_sample.records(), prompts, by_turn
    )


def record_counts(batches: Iterable[Any], expect: rc.Expectations, compared_samples: int = 0) -> Counts:
    """The flags of every record in `batches` (RecordBatches with COLUMNS, cached_tokens and turn), checked in
    columns as verify checks them, and its prompts' samples compared when `compared_samples` (checks.samples) is 2
    or more."""
    counts = Counts()
    comparison = SampleComparison(compared_samples) if compared_samples > 1 else None
    for batch in batches:
        counts.merge(_batch_counts(batch, batch_flags(batch, expect).counts()))
        if comparison is not None:
            _compare_samples(batch, comparison)
    return counts + _compared(comparison)
