"""The batch form of the record checks gives every record exactly the flags `inspect_record` gives it."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pyarrow as pa
import pytest

from datagen_operator.api.flags import ALL_FLAGS, RETRACTED, TRUNCATED, TRUNCATED_BY_MEMORY, UNEXPECTED_REASONING
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks import record_columns
from datagen_operator.checks.record_checks import Expectations, inspect_record
from datagen_operator.checks.record_columns import PROMPT_TAIL, batch_flags
from datagen_operator.output.parquet import parquet_schema

THINK, END_THINK, IM_END, BEGIN, END = 163606, 163607, 163586, 163595, 163596
NEWLINE = 198
CHANNEL, ANALYSIS, MESSAGE, RETURN = 200005, 35644, 200008, 200002

KIMI = Expectations(
    thinking=True,
    think_start_ids=(THINK,),
    think_end_id=END_THINK,
    stop_token_ids=frozenset({IM_END}),
    tool_marker_pairs=((BEGIN, END),),
    prompt_prefills_opener=True,
    prompt_tail_skip_ids=frozenset({NEWLINE}),
)
EXPECTATIONS = {
    "kimi": KIMI,
    "kimi-not-thinking": Expectations(**{**KIMI.__dict__, "thinking": False}),
    "harmony": Expectations(
        thinking=True,
        think_start_ids=(CHANNEL, ANALYSIS, MESSAGE),
        think_end_id=END_THINK,
        stop_token_ids=frozenset({RETURN, IM_END}),
        prompt_tail_skip_ids=frozenset({NEWLINE}),
    ),
    "no-reasoning-model": Expectations(
        thinking=False, think_start_ids=(), think_end_id=None, stop_token_ids=frozenset({IM_END})
    ),
    "no-opener": Expectations(
        thinking=True, think_start_ids=(), think_end_id=END_THINK, stop_token_ids=frozenset({IM_END})
    ),
    # A run with a penalty: a retracted record is flagged (record_checks.RETRACTED).
    "kimi-penalized": Expectations(**{**KIMI.__dict__, "restarted_by_retraction": ("frequency_penalty",)}),
    # Requests asked for 12 new tokens: a `length` finish with fewer is the server's memory cap.
    "kimi-capped": Expectations(**{**KIMI.__dict__, "max_new_tokens": 12}),
}
ALPHABET = [1, 2, 3, THINK, END_THINK, IM_END, BEGIN, END, NEWLINE, CHANNEL, ANALYSIS, MESSAGE, RETURN]
FINISHES: list[Any] = [
    {"type": "stop", "matched": IM_END},
    {"type": "stop", "matched": "NaN happened"},  # SGLang's NaN guard: a stop id written, matched a string
    {"type": "length", "length": 9},
    {"type": "abort", "message": "x"},
    {"type": "weird"},
    None,
]


def _ids(rng: random.Random, longest: int) -> list[int]:
    ids = [rng.choice(ALPHABET) for _ in range(rng.randrange(longest + 1))]
    if ids and rng.random() < 0.5:
        ids.append(rng.choice([IM_END, RETURN]))
    return ids


def _prompt(rng: random.Random) -> list[int]:
    body = [rng.choice([1, 2, 3]) for _ in range(rng.randrange(0, 30))]
    tails = [
        [THINK],
        [THINK, NEWLINE],
        [THINK, END_THINK],
        [THINK, NEWLINE, END_THINK, NEWLINE, NEWLINE],
        [CHANNEL, ANALYSIS, MESSAGE],
        [CHANNEL, ANALYSIS, MESSAGE, END_THINK],
        [THINK, *[NEWLINE] * rng.randrange(PROMPT_TAIL - 3, PROMPT_TAIL + 3)],  # the tail test reads past the window
        [THINK, END_THINK, *[NEWLINE] * rng.randrange(PROMPT_TAIL - 3, PROMPT_TAIL + 3)],
        [NEWLINE] * rng.randrange(1, PROMPT_TAIL + 4),
        [],
        _ids(rng, 6),
    ]
    return body + rng.choice(tails)


def _records(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        output = _ids(rng, 24)
        completion = rng.choice([len(output)] * 16 + [None, len(output) - 2, len(output) + 1, 0])
        prompt = _prompt(rng)
        if completion is not None and completion < len(output) and rng.random() < 0.5 and prompt:
            output = prompt[-2:] + output  # a prompt-suffix leak
            completion = len(output) - len(prompt[-2:])
        records.append(
            {
                "id": f"p{i}",
                "sample": 0,
                "input_ids": prompt,
                "output_ids": output,
                "finish_reason": None if (finish := rng.choice(FINISHES)) is None else orjson.dumps(finish).decode(),
                "completion_tokens": completion,
                "has_tools": rng.random() < 0.5,
                "flags": [],
                "num_retractions": rng.choice([None, 0, 0, 0, 1, 2]),  # None: a record written before the column
            }
        )
    return records


def _one_by_one(records: list[dict[str, Any]], expect: Expectations) -> list[frozenset[str]]:
    return [
        inspect_record(
            r["input_ids"],
            r["output_ids"],
            orjson.loads(r["finish_reason"]) if r["finish_reason"] else None,
            r["completion_tokens"],
            r["has_tools"],
            expect,
            r["num_retractions"],
        )
        for r in records
    ]


@pytest.mark.parametrize("name", sorted(EXPECTATIONS))
def test_batch_flags_equal_inspect_record(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expect = EXPECTATIONS[name]
    records = _records(seed=len(name), n=3000)
    table = pa.Table.from_pylist(records, schema=parquet_schema()).combine_chunks()
    # A slice, as Parquet batches are: its lists' offsets do not start at 0.
    batch = table.to_batches()[0].slice(1000, 2000)
    one_by_one = []
    monkeypatch.setattr(record_columns, "record_facts", lambda *a: one_by_one.append(a) or rc.record_facts(*a))
    flags = batch_flags(batch, expect)
    assert 0 < len(one_by_one) < 2000 // 2  # both ways are exercised, most records in columns
    combos = flags.combo_of_row.tolist()
    got = [flags.combos[c] for c in combos]
    want = _one_by_one(records[1000:3000], expect)
    assert got == want
    counted = flags.counts()
    for flag in ALL_FLAGS:
        raised = [i for i, f in enumerate(want) if flag in f]
        assert counted[flag] == len(raised)
        assert flags.rows_with(flag).tolist() == raised
    # The generator reaches the rules' branches (otherwise equality proves little).
    if name == "kimi":
        seen = set().union(*want)
        assert seen >= set(ALL_FLAGS) - {UNEXPECTED_REASONING, RETRACTED, TRUNCATED_BY_MEMORY}
        assert RETRACTED not in seen  # retractions are harmless without penalties or min_new_tokens
        assert TRUNCATED_BY_MEMORY not in seen  # what the requests asked for is not known here
    if name == "kimi-capped":
        cut = [f for f in want if TRUNCATED in f]
        assert any(TRUNCATED_BY_MEMORY in f for f in cut) and not all(TRUNCATED_BY_MEMORY in f for f in cut)
    if name == "kimi-penalized":
        assert any(RETRACTED in f for f in want) and not all(RETRACTED in f for f in want)
    if name == "kimi-not-thinking":
        assert any(UNEXPECTED_REASONING in f for f in want)
