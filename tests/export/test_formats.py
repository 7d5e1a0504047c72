"""The pure row builders: masks, labels, selection. No files."""

from __future__ import annotations

import itertools

import numpy as np
import orjson
import pyarrow as pa
import pytest

from datagen_operator.api.flags import effective_flags, stored_finish_type
from datagen_operator.export.formats import (
    IGNORE_INDEX,
    Selection,
    completion_counts,
    exclusion_reason,
    joined_ids,
    labels_values,
    loss_mask_values,
    row_metadata,
    speculators_row,
    text_row,
    token_columns,
)

STOP = 163586
PROMPTS = [[1, 2, 3], [7], [4, 5]]
OUTPUTS = [[10, 11, STOP], [12, STOP], [13, 14, 15]]  # the last one ended on `length`


def columns_from(prompts: list[list[int]], outputs: list[list[int]], *, slice_from: int = 0):
    tokens = pa.list_(pa.int32())
    # A sliced array (as a Parquet batch can be) must give the same rows as a fresh one.
    pad_in, pad_out = [[99, 98]] * slice_from, [[97]] * slice_from
    inputs = pa.array(pad_in + prompts, type=tokens).slice(slice_from)
    outputs_array = pa.array(pad_out + outputs, type=tokens).slice(slice_from)
    return token_columns(inputs, outputs_array)


def joined_rows(prompts, outputs, *, slice_from: int = 0):
    """(ids, loss_mask, labels) per row, as the trl table builds them."""
    tokens = columns_from(prompts, outputs, slice_from=slice_from)
    ids, offsets = joined_ids(tokens)
    mask = loss_mask_values(tokens)
    labels = labels_values(ids, mask)
    return [(ids[a:b], mask[a:b], labels[a:b]) for a, b in itertools.pairwise(offsets)]


@pytest.mark.parametrize("slice_from", [0, 2])
def test_rows_are_prompt_then_completion_exactly(slice_from: int) -> None:
    rows = joined_rows(PROMPTS, OUTPUTS, slice_from=slice_from)
    tokens = columns_from(PROMPTS, OUTPUTS, slice_from=slice_from)
    for row, (prompt, output) in enumerate(zip(PROMPTS, OUTPUTS, strict=True)):
        ids, mask, _ = rows[row]
        assert ids.tolist() == prompt + output
        assert mask.tolist() == [0] * len(prompt) + [1] * len(output)
        assert (tokens.prompt(row).tolist(), tokens.completion(row).tolist()) == (prompt, output)
        line = orjson.loads(speculators_row("p", 0, tokens.prompt(row), tokens.completion(row), {}))
        assert (line["input_ids"], line["loss_mask"]) == (ids.tolist(), mask.tolist())


def test_mask_is_not_shifted_and_the_stop_token_is_supervised() -> None:
    ids, mask, labels = joined_rows(PROMPTS, OUTPUTS)[0]
    # Unshifted: the first supervised position holds the first completion token, not the last prompt token.
    assert mask[len(PROMPTS[0]) - 1] == 0 and mask[len(PROMPTS[0])] == 1
    assert labels[len(PROMPTS[0])] == OUTPUTS[0][0]
    # The generated stop token is the last id and is under the loss.
    assert ids[-1] == STOP and mask[-1] == 1 and labels[-1] == STOP
    assert (labels[: len(PROMPTS[0])] == IGNORE_INDEX).all()


def test_completion_counts_cover_only_supervised_tokens() -> None:
    counts = completion_counts(columns_from(PROMPTS, OUTPUTS, slice_from=2))
    assert counts[STOP] == 2 and counts[10] == 1 and counts[1] == 0  # 1 is a prompt token
    assert counts.sum() == sum(map(len, OUTPUTS))


def test_length_rows_count_as_truncated_even_without_the_stored_flag() -> None:
    assert stored_finish_type('{"type": "length", "length": 3}') == "length"
    assert "truncated" in effective_flags([], "length")
    assert "truncated" not in effective_flags([], "stop")
    selection = Selection(exclude_flags=frozenset({"truncated"}))
    assert exclusion_reason(effective_flags([], "length"), 6, selection) == "flag:truncated"
    assert exclusion_reason(effective_flags([], "stop"), 6, selection) is None


def test_over_length_is_dropped_or_kept_never_cut() -> None:
    assert exclusion_reason(frozenset(), 11, Selection(max_length=10)) == "over_length"
    assert exclusion_reason(frozenset(), 10, Selection(max_length=10)) is None
    assert exclusion_reason(frozenset(), 11, Selection(max_length=10, over_length="keep-flagged")) is None


def test_speculators_row_has_the_consumers_columns_and_stable_metadata() -> None:
    tokens = columns_from(PROMPTS, OUTPUTS)
    meta = row_metadata("length", 2, 3, ["truncated"], unfinished=False, over_length=False)
    row = orjson.loads(speculators_row("p2", 1, tokens.prompt(2), tokens.completion(2), meta))
    assert row == {
        "id": "p2",
        "sample": 1,
        "turn": 0,
        "input_ids": [4, 5, 13, 14, 15],
        "loss_mask": [0, 0, 1, 1, 1],
        "metadata": {
            "finish_reason": "length",
            "prompt_tokens": 2,
            "completion_tokens": 3,
            "flags": ["truncated"],
            "unfinished": False,
            "over_length": False,
            "spans_supervised": 1,
            "spans_rerendered": 0,
        },
        "source_fields": None,  # the dataset line's other fields: none here
    }
    with_fields = speculators_row("p2", 1, tokens.prompt(2), tokens.completion(2), meta, fields='{"source":"x"}')
    assert orjson.loads(with_fields)["source_fields"] == {"source": "x"}


def test_text_row_reports_a_lossy_roundtrip() -> None:
    ids = (np.array([1, 2], dtype=np.int32), np.array([3, 4], dtype=np.int32))
    meta = row_metadata("stop", 2, 2, [], unfinished=False, over_length=False)
    exact = {"decode": lambda t: " ".join(map(str, t)), "encode": lambda s: [int(x) for x in s.split()]}
    lossy = {**exact, "encode": lambda s: [int(x) for x in s.split()][:-1]}
    assert orjson.loads(text_row("p", 0, *ids, meta, **exact, last_turn_only=False))["roundtrip_ok"] is True
    assert orjson.loads(text_row("p", 0, *ids, meta, **lossy, last_turn_only=False))["roundtrip_ok"] is False
    split = orjson.loads(text_row("p", 0, *ids, meta, **exact, last_turn_only=True))
    assert (split["prompt"], split["completion"], split["roundtrip_ok"]) == ("1 2", "3 4", False)  # no space joins them
    assert "text" not in split
