"""Segments, torn-tail recovery, the resume index, compaction and the public readers (real files)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datagen_operator.engine.tool_calls import ParsedCall
from datagen_operator.output.layout import RECORD_FIELDS, OutputLayout, keys_path
from datagen_operator.output.manifest import read_manifest, update_manifest
from datagen_operator.output.parquet import compact_shard
from datagen_operator.output.readers import RecordBatches, iter_records, iter_rejects
from datagen_operator.output.records import stored_split
from datagen_operator.output.writer import ShardWriter
from datagen_operator.prompts.conversation import AnswerSplit


def record(prompt: str, sample: int = 0, n_out: int = 5, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "id": prompt,
        "sample": sample,
        "input_ids": [1, 2, 3],
        "output_ids": list(range(100, 100 + n_out)),
        "finish_reason": {"type": "stop", "matched": 163586},
        "prompt_tokens": 3,
        "completion_tokens": n_out,
        "cached_tokens": 1,
        "latency_s": 0.5,
        "done_at": 1_796_000_000.125,  # when the answer arrived, Unix seconds
        "server": "http://127.0.0.1:1",
        "attempts": 1,
        "has_tools": False,
        "flags": list(flags),
        "line": ord(prompt[0]),
        "prompt_hash": 2**64 - 1,  # the whole uint64 range survives segments and Parquet
        "run": "local:host:1",
        "turn": 0,
        "thinking": None,
        "answer_content": None,
        "answer_reasoning": None,
        "answer_tool_calls": None,
        "num_retractions": 1,  # meta_info.num_retractions, stored as SGLang reports it
        "source_fields": '{"source":"glaive","metadata":{"n":1}}',  # the dataset line's other fields, JSON text
    }


def assert_batches_match(root: Path) -> None:
    """The batch reader yields exactly the records iter_records yields, in the same order."""
    rows = [row for batch in RecordBatches(root, RECORD_FIELDS, rows=2) for row in batch.to_pylist()]
    for row in rows:
        row["finish_reason"] = json.loads(row["finish_reason"]) if row["finish_reason"] else None
    assert rows == list(iter_records(root))


def write(layout: OutputLayout, records: list[dict[str, Any]], shard: int = 0) -> ShardWriter:
    writer = ShardWriter(layout, shard)
    writer.recover()
    for item in records:
        writer.append(item)
    writer.close()
    return writer


def test_records_round_trip_and_resume_index(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b", flags=("truncated",)), record("a", 1)])
    writer = ShardWriter(layout, 0)
    report = writer.recover()
    assert report.records == 3 and report.torn_bytes == 0
    assert writer.done == {("a", 0, 0), ("b", 0, 0), ("a", 1, 0)}
    assert writer.summary.output_tokens == 15 and writer.summary.flags == {"truncated": 1}
    got = list(iter_records(tmp_path))
    assert [(r["id"], r["sample"]) for r in got] == [("a", 0), ("b", 0), ("a", 1)]
    assert got[0] == record("a")
    assert_batches_match(tmp_path)


def test_torn_tail_is_dropped_and_the_next_run_writes_a_new_segment(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    writer = ShardWriter(layout, 0)
    writer.recover()
    writer.append(record("a"))
    writer.append(record("b"))
    writer.flush()  # in the file, but the process "dies" before close(): no keys file, no fsync
    segment = layout.segments(0)[0]
    with segment.open("ab") as file:
        file.write(b'{"id":"c","sample":0,"input_ids":[1,2')  # kill -9 in the middle of a write
    assert not keys_path(segment).exists()
    # A reader running meanwhile never sees the partial line.
    assert [r["id"] for r in iter_records(tmp_path)] == ["a", "b"]
    assert_batches_match(tmp_path)

    again = ShardWriter(layout, 0)
    report = again.recover()
    assert report.torn_bytes > 0 and again.done == {("a", 0, 0), ("b", 0, 0)}
    assert segment.read_bytes().endswith(b"\n") and keys_path(segment).exists()
    again.append(record("c"))
    again.close()
    assert [p.name for p in layout.segments(0)] == ["segment-000001.jsonl", "segment-000002.jsonl"]
    assert sorted(r["id"] for r in iter_records(tmp_path)) == ["a", "b", "c"]


def test_damaged_line_inside_a_segment_is_skipped_and_regenerated(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b"), record("c")])
    segment = layout.segments(0)[0]
    keys_path(segment).unlink()  # as after a power loss: the segment was never sealed
    data = segment.read_bytes().split(b"\n")
    data[1] = b"\x00" * len(data[1])  # unsynced pages come back as zeros
    segment.write_bytes(b"\n".join(data))
    writer = ShardWriter(layout, 0)
    report = writer.recover()
    assert report.corrupt_lines == 1
    assert writer.done == {("a", 0, 0), ("c", 0, 0)}
    assert sorted(r["id"] for r in iter_records(tmp_path)) == ["a", "c"]
    assert_batches_match(tmp_path)


def test_stale_keys_file_is_not_trusted(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("a")])
    segment = layout.segments(0)[0]
    with segment.open("ab") as file:  # grew after sealing (should not happen; must still be exact)
        file.write(json.dumps(record("z")).encode() + b"\n")
    writer = ShardWriter(layout, 0)
    writer.recover()
    assert writer.done == {("a", 0, 0), ("z", 0, 0)}


def test_rejects_are_written_once_per_key_and_server_rejects_count_as_done(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    writer = ShardWriter(layout, 0)
    writer.recover()
    assert writer.add_reject({"key": "line:3", "kind": "malformed", "line": 3, "reason": "bad JSON"})
    assert not writer.add_reject({"key": "line:3", "kind": "malformed", "line": 3, "reason": "bad JSON"})
    writer.add_reject({"key": "record:x#1", "kind": "server", "id": "x", "sample": 1, "status": 400, "reason": "r"})
    writer.close()
    again = ShardWriter(layout, 0)
    again.recover()
    assert again.rejected == {("x", 1, 0)} and again.reject_keys == {"line:3", "record:x#1"}
    assert not again.add_reject({"key": "line:3", "kind": "malformed", "line": 3, "reason": "bad JSON"})
    again.close()
    assert [r["key"] for r in iter_rejects(tmp_path)] == ["line:3", "record:x#1"]


def test_compaction_writes_dataset_order_int32_parquet_readable_everywhere(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    # Out of order, across two runs (two segments).
    write(layout, [record("c"), record("a", 1)])
    write(layout, [record("b", n_out=7), record("a")])
    result = compact_shard(layout, 0, 1, [("a", 0, 0), ("a", 1, 0), ("b", 0, 0), ("c", 0, 0)])
    assert result.rows == 4 and result.orphans == 0
    assert layout.segments(0) == []  # compacted data replaces the segments
    table = pq.read_table(result.path)
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("output_ids").type == pa.list_(pa.int32())
    assert list(zip(table["id"].to_pylist(), table["sample"].to_pylist(), strict=True)) == [
        ("a", 0), ("a", 1), ("b", 0), ("c", 0)
    ]  # fmt: skip
    assert table["output_ids"].to_pylist()[2] == list(range(100, 107))
    assert json.loads(table["finish_reason"][0].as_py()) == {"type": "stop", "matched": 163586}

    import datasets
    import pandas

    frame = pandas.read_parquet(result.path)
    assert list(frame["id"]) == ["a", "a", "b", "c"] and list(frame["output_ids"][2]) == list(range(100, 107))
    dataset = datasets.Dataset.from_parquet(str(result.path), cache_dir=str(tmp_path / "hf-cache"))
    assert dataset[2]["output_ids"] == list(range(100, 107)) and dataset.num_rows == 4

    # Readers see the same records from Parquet as from the segments.
    got = list(iter_records(tmp_path))
    assert [(r["id"], r["sample"]) for r in got] == [("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    assert got[0] == record("a")
    assert_batches_match(tmp_path)
    writer = ShardWriter(layout, 0)
    writer.recover(layout.parquet(0, 1))
    assert len(writer.done) == 4 and writer.summary.output_tokens == 22


def test_an_answers_tool_calls_survive_segments_and_parquet_and_older_outputs_read_without_them(
    tmp_path: Path,
) -> None:
    layout = OutputLayout(tmp_path)
    calls = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    split = {"answer_content": "", "answer_reasoning": "Look it up.", "turn": 0}
    write(layout, [record("a") | split | {"answer_tool_calls": calls}, record("b") | split | {"answer_tool_calls": []}])
    called = AnswerSplit("", "Look it up.", (ParsedCall("get_weather", '{"city": "Paris"}'),))
    expected = [called, AnswerSplit("", "Look it up.")]
    assert [stored_split(r) for r in iter_records(tmp_path)] == expected  # from the segments
    compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0)])
    assert [stored_split(r) for r in iter_records(tmp_path)] == expected  # from the Parquet
    assert_batches_match(tmp_path)
    # An output written before the column: its Parquet has none, and reads as answers without calls.
    path = layout.parquet(0, 1)
    pq.write_table(pq.read_table(path).drop_columns(["answer_tool_calls"]), path)
    assert [stored_split(r) for r in iter_records(tmp_path)] == [AnswerSplit("", "Look it up.")] * 2


def test_compaction_keeps_orphans_and_merges_new_records_into_an_earlier_parquet(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("b"), record("gone")])
    first = compact_shard(layout, 0, 1, [("b", 0, 0)])
    assert first.orphans == 1 and first.rows == 2
    write(layout, [record("a")])  # the dataset grew: a new prompt before b
    second = compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0)])
    ids = pq.read_table(second.path)["id"].to_pylist()
    assert ids == ["a", "b", "gone"]


def test_crash_between_compaction_and_segment_removal_duplicates_nothing(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b")])
    saved = tmp_path / "saved"
    shutil.copytree(layout.shard_dir(0), saved)
    compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0)])
    shutil.rmtree(layout.shard_dir(0))
    shutil.copytree(saved, layout.shard_dir(0))  # segments still there, as if removal never ran
    assert sorted(r["id"] for r in iter_records(tmp_path)) == ["a", "b"]
    assert_batches_match(tmp_path)
    writer = ShardWriter(layout, 0)
    writer.recover(layout.parquet(0, 1))
    assert writer.summary.records == 2 and writer.summary.output_tokens == 10
    again = compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0)])
    assert again.rows == 2


def test_manifest_updates_are_atomic_read_modify_write(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    assert read_manifest(tmp_path) is None
    update_manifest(layout, lambda m: {"shards": {"00000": {"state": "running", "counts": {"records": 2}}}})

    def add_shard(manifest: dict[str, Any] | None) -> dict[str, Any]:
        assert manifest is not None
        manifest["shards"]["00001"] = {"state": "complete", "counts": {"records": 3}}
        return manifest

    update_manifest(layout, add_shard)
    manifest = read_manifest(tmp_path)
    assert manifest is not None
    assert manifest["counts"] == {"records": 5, "shards_complete": 1}
    assert not list(tmp_path.glob(".manifest.json.*"))


def test_a_reader_racing_a_compaction_still_sees_every_record(tmp_path: Path) -> None:
    from datagen_operator.output import readers

    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b")])
    write(layout, [record("c")])
    real = readers.segment_records
    calls = 0

    def compact_after_first_segment(segment: Path):  # the compaction lands between two segment reads
        nonlocal calls
        calls += 1
        if calls == 2:
            compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0), ("c", 0, 0)])
        yield from real(segment)

    readers.segment_records = compact_after_first_segment
    try:
        ids = sorted(r["id"] for r in iter_records(tmp_path))
    finally:
        readers.segment_records = real
    assert ids == ["a", "b", "c"]

    # The batch reader, racing the same way (segments again, then a compaction between two reads).
    shutil.rmtree(tmp_path / "data")
    write(layout, [record("a"), record("b")])
    write(layout, [record("c")])
    calls = 0
    readers.segment_records = compact_after_first_segment
    try:
        batched = sorted(row["id"] for batch in RecordBatches(tmp_path, ["id"]) for row in batch.to_pylist())
    finally:
        readers.segment_records = real
    assert calls == 2 and batched == ["a", "b", "c"]


def test_duplicate_rows_in_parquet_are_read_once(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b"), record("c")])
    result = compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0), ("c", 0, 0)])
    table = pq.read_table(result.path)
    pq.write_table(pa.concat_tables([table, table.slice(1, 1), table]), result.path, row_group_size=2)
    assert [r["id"] for r in iter_records(tmp_path)] == ["a", "b", "c"]
    assert_batches_match(tmp_path)
    batches = RecordBatches(tmp_path, ["id"])
    assert [row["id"] for batch in batches for row in batch.to_pylist()] == ["a", "b", "c"]
    assert batches.duplicates == 4


def test_keys_sharing_a_hash_are_still_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datagen_operator.output import readers

    layout = OutputLayout(tmp_path)
    write(layout, [record("a"), record("b"), record("a", 1)])
    result = compact_shard(layout, 0, 1, [("a", 0, 0), ("b", 0, 0), ("a", 1, 0)])
    table = pq.read_table(result.path)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), result.path)
    monkeypatch.setattr(readers, "_key_hashes", lambda ids, samples, turns: np.zeros(len(ids), np.uint64))
    assert readers.first_occurrences([result.path]).tolist() == [True, True, True, False]
