"""Dataset reading and shard assignment (pure; files in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datagen_operator.prompts.dataset_ref import DatasetError, DatasetRef
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.shards import shard_of_id


def _write_jsonl(path: Path, lines: list[bytes | dict]) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines))
    return path


def _prompt(i: int | str, **extra: object) -> dict:
    return {"id": i if isinstance(i, str) else f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}], **extra}


def test_every_valid_prompt_lands_in_exactly_one_shard_in_dataset_order(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [_prompt(i) for i in range(200)])
    plans = [plan_shard(DatasetRef(path), i, 4) for i in range(4)]
    ids = [ref.id for plan in plans for ref in plan.prompts]
    assert sorted(ids) == sorted(f"p{i}" for i in range(200))
    for plan in plans:
        positions = [ref.position for ref in plan.prompts]
        assert positions == sorted(positions)
        assert all(shard_of_id(ref.id, 4) == plan.shard_index for ref in plan.prompts)
    # Not degenerate: every shard gets a fair part.
    assert all(30 <= len(plan.prompts) <= 70 for plan in plans)


def test_assignment_is_stable_across_calls_and_independent_of_other_lines(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", [_prompt(i) for i in range(50)])
    b = _write_jsonl(tmp_path / "b.jsonl", [_prompt(i) for i in reversed(range(50))] + [_prompt(99)])
    for shard in range(3):
        first = {ref.id for ref in plan_shard(DatasetRef(a), shard, 3).prompts}
        again = {ref.id for ref in plan_shard(DatasetRef(a), shard, 3).prompts}
        other = {ref.id for ref in plan_shard(DatasetRef(b), shard, 3).prompts} - {"p99"}
        assert first == again == other
    # Pinned values: a change to the hash would silently reshuffle resumed runs.
    assert [shard_of_id(f"p{i}", 8) for i in range(8)] == [4, 1, 4, 7, 2, 2, 5, 7]
    assert shard_of_id("p0", 1) == 0


def test_hash_is_not_pythons_salted_hash() -> None:
    import subprocess
    import sys

    code = "from datagen_operator.prompts.shards import shard_of_id; print(shard_of_id('abc', 1000))"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": seed}, check=True
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


def test_malformed_lines_are_set_aside_once_across_shards(tmp_path: Path) -> None:
    lines: list[bytes | dict] = [
        _prompt(0),
        b"{not json",
        {"id": "", "messages": [{"role": "user", "content": "an empty id"}]},  # no id at all: derived from content
        {"id": "p5", "messages": []},
        _prompt(1),
        _prompt(0),  # duplicate of line 0
        {"id": None, "messages": [{"role": "user", "content": "x"}]},
        {"id": "p7", "messages": [{"content": "no role"}]},
        b"",
        b"[1, 2]",
        {"id": 42, "messages": [{"role": "user", "content": "an integer id is read as its decimal string"}]},
        {"id": "42", "messages": [{"role": "user", "content": "the same id as a string: a collision, named"}]},
    ]
    path = _write_jsonl(tmp_path / "d.jsonl", lines)
    plans = [plan_shard(DatasetRef(path), i, 3) for i in range(3)]
    malformed = sorted((m.position, m.reason) for plan in plans for m in plan.malformed)
    assert [position for position, _ in malformed] == [1, 2, 3, 5, 6, 7, 9, 11]
    reasons = dict(malformed)
    assert reasons[1].startswith("bad JSON")
    assert reasons[2] == "empty id"
    assert reasons[3] == "empty or missing messages"
    assert "duplicate id 'p0'" in reasons[5]
    valid = sorted(ref.id for plan in plans for ref in plan.prompts)
    assert reasons[11].startswith(
        "id '42' collides: an earlier line holds it as the integer and this one as the string"
    )
    assert valid == ["42", "p0", "p1"]
    # The first p0 is the one kept.
    owner = next(plan for plan in plans if any(ref.id == "p0" for ref in plan.prompts))
    assert [ref.position for ref in owner.prompts if ref.id == "p0"] == [0]


def test_prompts_load_back_with_tools(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    path = _write_jsonl(tmp_path / "d.jsonl", [_prompt(0, tools=tools), _prompt(1)])
    plan = plan_shard(DatasetRef(path), 0, 1)
    loaded = list(plan.iter_prompts())
    assert [p.id for p in loaded] == ["p0", "p1"]
    assert loaded[0].tools == tools and loaded[1].tools is None
    assert loaded[1].messages == [{"role": "user", "content": "q1"}]


def test_parquet_dataset_with_struct_messages_and_json_tools(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a", "b", None],
            "messages": [
                [{"role": "user", "content": "hi"}],
                [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}],
                [{"role": "user", "content": "no id"}],
            ],
            "tools": ['[{"type": "function", "function": {"name": "f"}}]', None, None],
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert plan.format == "parquet"
    prompts = list(plan.iter_prompts())
    assert [p.id for p in prompts] == ["a", "b"]
    assert prompts[0].tools == [{"type": "function", "function": {"name": "f"}}]
    assert [m.reason for m in plan.malformed] == ["missing id"]


def test_bad_dataset_and_bad_shard_index_are_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        plan_shard(DatasetRef(tmp_path / "missing.jsonl"), 0, 1)
    path = _write_jsonl(tmp_path / "d.jsonl", [_prompt(0)])
    with pytest.raises(DatasetError, match="outside"):
        plan_shard(DatasetRef(path), 2, 2)
