"""The per-record checks over a batch of stored records at once, for `datagen verify` of millions of records.

The rules stay in `record_checks.flags_of`; this module only finds the same `RecordFacts` that
`record_checks.record_facts` finds in one record, here with numpy over an Arrow batch's list columns (the
token ids are never made Python ints), and asks `flags_of` once per distinct combination of facts. Records
whose facts are not cheap to find that way (a token-count mismatch, whose prompt-suffix test is rare;
a prompt whose tail runs past the window looked at) go through `record_facts` one by one.
A test holds the two to identical flags over generated records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from datagen_operator.api.flags import finish_type
from datagen_operator.checks.record_checks import (
    EMPTY,
    NO_THINK_END_FOUND,
    WRITTEN,
    Expectations,
    RecordFacts,
    flags_of,
    prompt_closes_think,
    prompt_opens_think,
    record_facts,
    stop_matched_no_token,
    tail_end,
)

COLUMNS = ("input_ids", "output_ids", "finish_reason", "completion_tokens", "has_tools", "thinking", "num_retractions")
"""The stored columns the checks read."""

PROMPT_TAIL = 8
"""Prompt ids looked at from the end; a prompt whose tail test reads further is checked one by one."""

_KINDS: tuple[str | None, ...] = (None, "stop", "length", "abort")
_BOOLS = (
    "count_mismatch",
    "suffix_leak",
    "ends_with_stop",
    "reasoning_starts_in_prompt",
    "prompt_closes_think",
    "opener_in_output",
    "think_end_in_output",
    "tool_calls_unbalanced",
    "stop_not_token",
    "retracted",
    "cut_short",
)
_REASONING_SHIFT = 2 + len(_BOOLS)
"""A combination of facts as one int: kind (2 bits), one bit per boolean, then `reasoning` (2 bits)."""


def _encode(facts: RecordFacts) -> int:
    code = _KINDS.index(facts.kind if facts.kind in _KINDS else None)
    for bit, name in enumerate(_BOOLS):
        code |= int(getattr(facts, name)) << (2 + bit)
    return code | facts.reasoning << _REASONING_SHIFT


def _decode(code: int) -> RecordFacts:
    bools = {name: bool(code >> (2 + bit) & 1) for bit, name in enumerate(_BOOLS)}
    return RecordFacts(kind=_KINDS[code & 3], reasoning=code >> _REASONING_SHIFT, **bools)


@dataclass(frozen=True)
class BatchFlags:
    """The flags of every record of a batch, grouped by their combination of facts."""

    combos: list[frozenset[str]]
    """The flags of each distinct combination of facts in the batch."""
    combo_of_row: Any
    """np.ndarray: each row's index into `combos`."""

    def counts(self) -> Counter[str]:
        rows = np.bincount(self.combo_of_row, minlength=len(self.combos))
        counts: Counter[str] = Counter()
        for flags, n in zip(self.combos, rows.tolist(), strict=True):
            for flag in flags:
                counts[flag] += n
        return counts

    def rows_with(self, flag: str) -> Any:
        """np.ndarray: the rows (in batch order) that raise `flag`."""
        combos = [i for i, flags in enumerate(self.combos) if flag in flags]
        return np.flatnonzero(np.isin(self.combo_of_row, combos))


class _Lists:
    """A list<int32> column as its flat values and int64 offsets into them (a sliced column's own values only)."""

    def __init__(self, column: Any) -> None:
        offsets = column.offsets.to_numpy().astype(np.int64)
        self.values = column.values.to_numpy()[offsets[0] : offsets[-1]]
        self.offsets = offsets - offsets[0]
        self.starts, self.ends = self.offsets[:-1], self.offsets[1:]
        self.lengths = self.ends - self.starts

    def occurrences(self, seq: tuple[int, ...]) -> Any:
        """Sorted flat positions where `seq` starts inside one list."""
        if not seq:
            return np.empty(0, np.int64)
        at = np.flatnonzero(self.values == seq[0])
        if len(seq) > 1:
            row = np.searchsorted(self.offsets, at, side="right") - 1
            at = at[at + len(seq) <= self.ends[row]]
            for j, token in enumerate(seq[1:], 1):
                at = at[self.values[at + j] == token]
        return at

    def first_at_or_after(self, positions: Any, start: Any) -> Any:
        """Per list: the index of the first of `positions` at or after `start` (per list), or -1."""
        if not len(positions):
            return np.full(len(self.starts), -1, np.int64)
        begin = self.starts + start
        at = np.searchsorted(positions, begin)
        found = np.where(at < len(positions), positions[np.minimum(at, len(positions) - 1)], np.iinfo(np.int64).max)
        return np.where(found < self.ends, found - self.starts, -1)

    def count(self, positions: Any) -> Any:
        return np.diff(np.searchsorted(positions, self.offsets))


def _kinds(finish_reason: Any) -> tuple[Any, Any]:
    """Each row's finish kind as an index into _KINDS, and whether it is a stop on no token id
    (stop_matched_no_token): the stored JSON strings are few distinct values."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(finish_reason)
    codes, no_token = [], []
    for text in encoded.dictionary.to_pylist():
        finish = orjson.loads(text) if text else None
        kind = finish_type(finish)
        codes.append(_KINDS.index(kind if kind in _KINDS else None))
        no_token.append(kind == "stop" and stop_matched_no_token(finish))
    indices = encoded.indices.fill_null(-1).to_numpy()
    # A null finish_reason (-1) picks the appended entry: kind None, no stop.
    return np.asarray([*codes, 0], np.int64)[indices], np.asarray([*no_token, False], bool)[indices]


def _prompt_tails(inputs: _Lists, expect: Expectations) -> tuple[Any, Any, Any]:
    """(reasoning starts in the prompt, the prompt closes an empty think block, decided here) per row, from
    the last PROMPT_TAIL ids of each prompt, the tests run once per distinct tail."""
    n = len(inputs.starts)
    tails = np.full((n, PROMPT_TAIL), -1, np.int64)
    for j in range(PROMPT_TAIL):
        at = inputs.ends - PROMPT_TAIL + j
        inside = at >= inputs.starts
        tails[inside, j] = inputs.values[at[inside]]
    distinct, inverse, exact = _distinct_rows(tails)
    opens, closes, decided = [], [], []
    k = len(expect.think_start_ids)
    skip = expect.prompt_tail_skip_ids
    for row in distinct.tolist():
        tail = [token for token in row if token >= 0]
        whole = len(tail) < PROMPT_TAIL
        end = tail_end(tail, len(tail), skip)
        # The tests read the skipped tail, one closer and the opener: all inside the window, or the window
        # is the whole prompt.
        reach_ok = end > k and (tail[end - 1] != expect.think_end_id or tail_end(tail, end - 1, skip) > k)
        opens.append(not expect.think_start_ids or prompt_opens_think(tail, expect))
        closes.append(prompt_closes_think(tail, expect))
        decided.append(whole or reach_ok)
    as_bools = (np.asarray(values, bool)[inverse] for values in (opens, closes, decided))  # bool even when empty
    opened, closed, decided_rows = as_bools
    return opened, closed, decided_rows & exact


def _distinct_rows(matrix: Any) -> tuple[Any, Any, Any]:
    """(distinct rows, each row's index into them, whether the row equals its distinct row): rows grouped
    by a 64-bit hash (a sort of ints; np.unique(axis=0) sorts rows as bytes, ten times slower); a row
    sharing a hash with a different one is reported inexact rather than trusted."""
    multipliers = np.random.default_rng(0).integers(1, 2**63, matrix.shape[1], dtype=np.uint64) | np.uint64(1)
    hashes = (matrix.astype(np.uint64) * multipliers).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    distinct = matrix[first]
    return distinct, inverse, (matrix == distinct[inverse]).all(axis=1)


def batch_flags(batch: Any, expect: Expectations) -> BatchFlags:
    """The flags of every record in an Arrow batch with COLUMNS (the store's Parquet schema). A record whose line
    switched thinking itself (its `thinking` column, when the batch has it) is judged by that switch."""
    names = batch.schema.names
    column = batch.column("thinking") if "thinking" in names else None
    if column is None or column.null_count == len(column):
        return _batch_flags(batch, expect)
    other = column.fill_null(expect.thinking).to_numpy(zero_copy_only=False) != expect.thinking
    if not other.any():
        return _batch_flags(batch, expect)
    import pyarrow as pa

    own = _batch_flags(batch.filter(pa.array(~other)), expect)
    switched = _batch_flags(batch.filter(pa.array(other)), expect.for_line(not expect.thinking))
    combo_of_row = np.empty(batch.num_rows, np.int64)
    combo_of_row[~other] = own.combo_of_row
    combo_of_row[other] = switched.combo_of_row + len(own.combos)
    return BatchFlags([*own.combos, *switched.combos], combo_of_row)


def _batch_flags(batch: Any, expect: Expectations) -> BatchFlags:
    outputs = _Lists(batch.column("output_ids"))
    n = batch.num_rows
    kinds, stop_not_token = _kinds(batch.column("finish_reason"))
    completion = batch.column("completion_tokens")
    expected_len = completion.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    mismatch = completion.is_valid().to_numpy(zero_copy_only=False) & (outputs.lengths != expected_len)
    last = outputs.values[np.maximum(outputs.ends - 1, 0)] if len(outputs.values) else np.zeros(n, np.int64)
    ends_with_stop = (outputs.lengths > 0) & np.isin(last, list(expect.stop_token_ids))
    has_tools = batch.column("has_tools").fill_null(False).to_numpy(zero_copy_only=False)
    unbalanced = np.zeros(n, bool)
    for begin, end in expect.tool_marker_pairs:
        unbalanced |= outputs.count(outputs.occurrences((begin,))) != outputs.count(outputs.occurrences((end,)))
    unbalanced &= has_tools & (kinds == _KINDS.index("stop"))
    one_by_one = mismatch.copy()  # the prompt-suffix test: rare, and exact only on the whole record

    code = kinds | ends_with_stop.astype(np.int64) << (2 + _BOOLS.index("ends_with_stop"))
    code |= unbalanced.astype(np.int64) << (2 + _BOOLS.index("tool_calls_unbalanced"))
    code |= stop_not_token.astype(np.int64) << (2 + _BOOLS.index("stop_not_token"))
    if "num_retractions" in batch.schema.names:  # outputs written before the column: never retracted
        retracted = batch.column("num_retractions").fill_null(0).to_numpy(zero_copy_only=False) > 0
        code |= retracted.astype(np.int64) << (2 + _BOOLS.index("retracted"))
    if expect.max_new_tokens is not None:
        code |= (outputs.lengths < expect.max_new_tokens).astype(np.int64) << (2 + _BOOLS.index("cut_short"))
    if expect.think_end_id is not None:
        reasoning_code, undecided = _reasoning(batch, outputs, expect)
        code |= reasoning_code
        one_by_one |= undecided
    rows = np.flatnonzero(one_by_one)
    if len(rows):
        some = batch.select([name for name in COLUMNS if name in batch.schema.names]).take(rows).to_pylist()
        for row, record in zip(rows.tolist(), some, strict=True):
            finish = orjson.loads(record["finish_reason"]) if record["finish_reason"] else None
            facts = record_facts(
                record["input_ids"], record["output_ids"], finish, record["completion_tokens"],
                bool(record["has_tools"]), expect, record.get("num_retractions"),
            )  # fmt: skip
            code[row] = _encode(facts)
    distinct, combo_of_row = np.unique(code, return_inverse=True)
    combos = [flags_of(_decode(int(c)), expect) for c in distinct.tolist()]
    return BatchFlags(combos, combo_of_row.reshape(-1))


@dataclass(frozen=True)
class _ThinkSpan:
    """Where each row's reasoning starts and ends in its output (positions within the row's list)."""

    starts_in_prompt: Any
    closes: Any
    """The prompt closes an empty think block (thinking off)."""
    decided: Any
    """The prompt-tail facts are exact from the window looked at (else the row is checked one by one)."""
    opened_at: Any
    """The think opener's position in the output, or -1."""
    end_anywhere: Any
    reasoning_from: Any
    end_at: Any
    """The first think end at or after reasoning_from, or -1."""


def _think_span(batch: Any, outputs: _Lists, expect: Expectations) -> _ThinkSpan:
    n = len(outputs.starts)
    end_id = expect.think_end_id
    assert end_id is not None
    opener = expect.think_start_ids
    ends = outputs.occurrences((end_id,))
    end_anywhere = outputs.first_at_or_after(ends, np.zeros(n, np.int64)) >= 0
    opened_at = outputs.first_at_or_after(outputs.occurrences(opener), np.zeros(n, np.int64))
    if expect.thinking:
        starts_in_prompt, closes, decided = _prompt_tails(_Lists(batch.column("input_ids")), expect)
    else:
        starts_in_prompt, closes, decided = np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool)
    reasoning_from = np.where(starts_in_prompt | (opened_at < 0), 0, opened_at + len(opener))
    end_at = outputs.first_at_or_after(ends, reasoning_from)
    return _ThinkSpan(starts_in_prompt, closes, decided, opened_at, end_anywhere, reasoning_from, end_at)


def _reasoning(batch: Any, outputs: _Lists, expect: Expectations) -> tuple[Any, Any]:
    """The reasoning facts' bits per row, and the rows whose prompt tail must be checked one by one."""
    span = _think_span(batch, outputs, expect)
    end_at, reasoning_from = span.end_at, span.reasoning_from
    reasoning = np.where(end_at < 0, NO_THINK_END_FOUND, np.where(end_at - reasoning_from <= 0, EMPTY, WRITTEN))
    reasoning = reasoning.astype(np.int64)
    bits = {
        "reasoning_starts_in_prompt": span.starts_in_prompt,
        "prompt_closes_think": span.closes,
        "opener_in_output": span.opened_at >= 0,
        "think_end_in_output": span.end_anywhere,
    }
    code = reasoning << _REASONING_SHIFT
    for name, values in bits.items():
        code |= values.astype(np.int64) << (2 + _BOOLS.index(name))
    return code, ~span.decided


@dataclass(frozen=True)
class TokenLengths:
    """Per row of a batch, in tokens: the prompt, the reasoning and the answer after it."""

    prompt: Any
    reasoning: Any
    """np.ndarray: tokens between where the reasoning starts and the think end, as the checks place them; -1 where
    the output holds no think end (or the model has none)."""
    answer: Any
    """np.ndarray: tokens after the think end, the whole output where there is none."""


def token_lengths(batch: Any, expect: Expectations) -> TokenLengths:
    """The lengths a person looks at before training (`datagen verify --html`), over a batch with input_ids and
    output_ids. Rows are judged by the run's thinking switch (a line's own switch only moves where a prompt-opened
    reasoning starts)."""
    outputs = _Lists(batch.column("output_ids"))
    prompt = _Lists(batch.column("input_ids")).lengths
    if expect.think_end_id is None:
        return TokenLengths(prompt, np.full(len(prompt), -1, np.int64), outputs.lengths)
    span = _think_span(batch, outputs, expect)
    found = span.end_at >= 0
    reasoning = np.where(found, span.end_at - span.reasoning_from, -1)
    answer = np.where(found, outputs.lengths - span.end_at - 1, outputs.lengths)
    return TokenLengths(prompt, reasoning, answer)
