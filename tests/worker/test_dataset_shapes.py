"""The shapes chat datasets come in: OpenAI or ShareGPT messages under `messages` or `conversations`, ids from
an id field or derived from the content, every problem of a refused line named, JSON array files read streamed,
Parquet `conversations` columns, and a dataset mostly of another shape refused as a whole."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datagen_operator.prompts import json_array, line_shape
from datagen_operator.prompts.dataset_ref import UTF8_BOM, DatasetError, DatasetRef, detect_format
from datagen_operator.prompts.json_array import ArrayBreak, iter_json_array
from datagen_operator.prompts.line_shape import (
    BAD_ID,
    BAD_JSON,
    BAD_MESSAGES,
    CAUSES,
    DUPLICATE_ID,
    INVALID_TOOLS,
    NOT_OBJECT,
    UNKNOWN_SHAPE,
    validate_prompt,
)
from datagen_operator.prompts.lines import MalformedLine, PromptRef
from datagen_operator.prompts.pin import pin_changes, pin_dataset, prompt_hash
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.scan import ShardScan, has_prompt
from datagen_operator.prompts.summary import UnknownDatasetShape, check_dataset, check_plan, dataset_summary

EXPECTED = "expected system/developer/user/assistant/tool (OpenAI {role, content}) or ShareGPT {from: human|gpt|system|tool, value}"


def _jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines))
    return path


def _scan(path: Path, **kwargs: Any) -> tuple[list[tuple[PromptRef, dict[str, Any]]], list[MalformedLine]]:
    items = list(ShardScan(DatasetRef(path, **kwargs), 0, 1))
    return [i for i in items if not isinstance(i, MalformedLine)], [i for i in items if isinstance(i, MalformedLine)]


def _derived(messages: list[dict[str, Any]], tools: Any = None) -> str:
    body = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(body).hexdigest()[:16]


# --- ShareGPT, conversations, normalised messages ----------------------------------------------------------------


def test_sharegpt_conversations_reach_every_caller_as_openai_messages(tmp_path: Path) -> None:
    openai = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    sharegpt = [{"from": "system", "value": "s"}, {"from": "human", "value": "q", "weight": 0}]
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": "a", "conversations": sharegpt},
            {"id": "b", "messages": openai},
            {"id": "c", "conversations": openai},  # OpenAI messages under the ShareGPT key
            {"id": "d", "messages": [{"from": "gpt", "value": "x"}, {"role": "user", "content": "y"}]},  # mixed
            {"id": "e", "messages": None, "conversations": [{"from": "human", "value": "q"}]},
        ],
    )
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert plan.malformed == []
    loaded = {prompt.id: prompt.messages for prompt in plan.iter_prompts()}
    assert loaded["a"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]  # `weight` dropped
    assert loaded["b"] == openai  # every other key of an OpenAI message kept, content None as it is
    assert loaded["c"] == openai
    assert loaded["d"] == [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    assert loaded["e"] == [{"role": "user", "content": "q"}]


SHAREGPT_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "function_response": "tool",
    "ipython": "tool",
    "function_call": "assistant",
}


@pytest.mark.parametrize(("speaker", "role"), sorted(SHAREGPT_MAP.items()))
def test_every_sharegpt_role_maps_to_its_openai_role(tmp_path: Path, speaker: str, role: str) -> None:
    value = '{"name": "f", "arguments": {}}' if speaker == "function_call" else f"text of {speaker}"
    path = _jsonl(tmp_path / "d.jsonl", [{"id": "p", "conversations": [{"from": speaker, "value": value}]}])
    (prompt,) = plan_shard(DatasetRef(path), 0, 1).iter_prompts()
    assert prompt.messages == [{"role": role, "content": value}]  # a function_call's value kept as content


def test_the_role_maps_are_exactly_the_documented_ones() -> None:
    assert dict(line_shape.SHAREGPT_ROLES) == SHAREGPT_MAP
    assert sorted(line_shape.OPENAI_ROLES) == ["assistant", "developer", "system", "tool", "user"]
    assert UNKNOWN_SHAPE == "unknown_shape" and UNKNOWN_SHAPE in CAUSES


# --- unknown shapes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "found"),
    [
        ({"role": "narrator", "content": "x"}, "has role 'narrator'"),
        ({"role": "narrator", "content": "x"}, "has role 'narrator'"),
        ({"role": 7, "content": "x"}, "has role 7"),
        ({"from": "narrator", "value": "x"}, "has from 'narrator'"),
        ({"from": "human"}, "has from but no value"),
        ({"speaker": "a", "text": "x"}, "has keys 'speaker', 'text'"),
        ({}, "has no keys"),
    ],
)
def test_a_message_of_no_known_shape_names_its_number_what_it_has_and_the_shapes(
    tmp_path: Path, message: dict[str, Any], found: str
) -> None:
    messages = [{"role": "user", "content": "q"}, {"from": "gpt", "value": "a"}, message]
    path = _jsonl(tmp_path / "d.jsonl", [{"id": "p", "messages": messages}])
    prompts, (aside,) = _scan(path)
    assert prompts == []
    assert aside.cause == UNKNOWN_SHAPE and aside.id == "p"
    assert aside.reason == f"message 3 (messages[2]) {found}; {EXPECTED}"


def test_a_line_of_another_kind_names_its_keys(tmp_path: Path) -> None:
    alpaca = {"instruction": "i", "input": "", "output": "o", "a": 1, "b": 2, "c": 3}
    path = _jsonl(
        tmp_path / "d.jsonl",
        [alpaca, {"id": "x", "prompt": "p"}, {"id": "y"}, {"id": "z", "messages": []}, {"conversations": "q"}, {}],
    )
    _, aside = _scan(path)
    by_line = {item.position: item for item in aside}
    assert by_line[0].cause == UNKNOWN_SHAPE
    assert by_line[0].reason.startswith(
        "no messages or conversations: the object has keys 'instruction', 'input', 'output', 'a', 'b' and 1 more;"
    )
    assert by_line[1].cause == UNKNOWN_SHAPE and "has keys 'prompt';" in by_line[1].reason  # the id is not a shape
    # An empty or non-list conversation, or an object with only its id, is a conversation missing: bad_messages.
    assert (by_line[2].cause, by_line[2].reason) == (BAD_MESSAGES, "empty or missing messages")
    assert (by_line[3].cause, by_line[3].reason) == (BAD_MESSAGES, "empty or missing messages")
    assert (by_line[4].cause, by_line[4].reason) == (BAD_MESSAGES, "empty or missing conversations")
    assert by_line[5].cause == BAD_MESSAGES


# --- ids -----------------------------------------------------------------------------------------------------


def test_a_line_without_an_id_gets_one_derived_from_its_content(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    convs = [
        [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}", "reasoning_content": "r"}]
        for i in range(40)
    ]
    lines: list[Any] = [{"messages": m, "meta": i} for i, m in enumerate(convs)] + [
        {"messages": convs[0], "tools": tools}
    ]
    forward = _jsonl(tmp_path / "f.jsonl", lines)
    backward = _jsonl(tmp_path / "b.jsonl", list(reversed(lines)))
    expected = [_derived(m) for m in convs] + [_derived(convs[0], tools)]
    assert [ref.id for ref, _ in _scan(forward)[0]] == expected  # `meta` is not part of the conversation
    assert len(set(expected)) == len(expected)  # tools are
    # Reordering the file moves no id and no prompt to another shard.
    for shard in range(3):
        a = {(ref.id, ref.position) for ref in plan_shard(DatasetRef(forward), shard, 3).prompts}
        b = {(ref.id, len(lines) - 1 - ref.position) for ref in plan_shard(DatasetRef(backward), shard, 3).prompts}
        assert a == b


def test_equal_conversations_are_one_prompt_whatever_their_shape(tmp_path: Path) -> None:
    openai = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    sharegpt = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"messages": openai},
            {"conversations": sharegpt, "source": "elsewhere"},
            {"messages": openai, "tools": []},  # no tools: the same prompt
            {"messages": [*openai, {"role": "user", "content": "more"}]},
        ],
    )
    prompts, aside = _scan(path)
    assert [ref.id for ref, _ in prompts] == [
        _derived(openai),
        _derived([*openai, {"role": "user", "content": "more"}]),
    ]
    assert [(item.position, item.cause) for item in aside] == [(1, DUPLICATE_ID), (2, DUPLICATE_ID)]
    assert f"duplicate id {_derived(openai)!r}" in aside[0].reason


def test_an_id_field_names_where_ids_live(tmp_path: Path) -> None:
    message = [{"role": "user", "content": "q"}]
    path = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"uuid": "u1", "id": 5, "messages": message},  # `id` is just another key here
            {"uuid": 7, "messages": message},
            {"uuid": "", "messages": message},
            {"id": "x", "messages": [{"role": "user", "content": "no uuid"}]},
        ],
    )
    prompts, aside = _scan(path, id_field="uuid")
    assert [ref.id for ref, _ in prompts] == ["u1", "7", _derived([{"role": "user", "content": "no uuid"}])]
    assert [(item.position, item.cause, item.reason) for item in aside] == [(2, BAD_ID, "empty uuid")]
    # Every entry point reads the same field.
    plan = plan_shard(DatasetRef(path, id_field="uuid"), 0, 1)
    assert [ref.id for ref in plan.prompts] == [ref.id for ref, _ in prompts]
    assert dataset_summary(DatasetRef(path, id_field="uuid")).prompts == 3
    assert check_dataset(DatasetRef(path, id_field="uuid")).set_aside == {BAD_ID: 1}
    # Without it, `id` is the field: the integer 5 is "5", the uuid lines get derived ids (two equal ones).
    default = dataset_summary(DatasetRef(path))
    assert default.set_aside == {DUPLICATE_ID: 1} and default.prompts == 3
    only_bad = _jsonl(tmp_path / "bad.jsonl", [{"uuid": 1.5, "messages": message}])
    assert not has_prompt(ShardScan(DatasetRef(only_bad, id_field="uuid"), 0, 1))
    assert has_prompt(ShardScan(DatasetRef(only_bad), 0, 1))  # a derived id under the default field


def test_an_id_field_holds_in_json_arrays_and_names_changed_lines(tmp_path: Path) -> None:
    message = [{"role": "user", "content": "q"}]
    path = tmp_path / "d.json"
    path.write_bytes(orjson.dumps([{"uuid": "u1", "messages": message}, {"uuid": [3], "messages": message}]))
    prompts, (aside,) = _scan(path, id_field="uuid")
    assert [ref.id for ref, _ in prompts] == ["u1"] and (aside.position, aside.cause) == (1, BAD_ID)
    # The pin names an edited line by the id field's value, or by its derived id without one.
    lines = _jsonl(tmp_path / "d.jsonl", [{"uuid": "u1", "id": "x", "messages": message}, {"messages": message}])
    pin = pin_dataset(DatasetRef(lines, id_field="uuid"))
    edited = [{"uuid": "u1-new", "id": "x", "messages": message}, {"messages": [{"role": "user", "content": "z"}]}]
    _jsonl(lines, edited)
    derived = _derived([{"role": "user", "content": "z"}])
    assert pin_changes(pin, pin_dataset(DatasetRef(lines, id_field="uuid"))) == (
        f"2 lines edited (line 1 (id 'u1-new'), line 2 (id {derived!r}))"
    )


def test_an_unchanged_dataset_is_held_to_its_pin_without_reading_its_lines(tmp_path: Path, monkeypatch) -> None:
    """One sha256 of the file while it is the pinned one; its lines are read again only to name a change."""
    from datagen_operator.prompts import pin as pins

    message = [{"role": "user", "content": "q"}]
    path = _jsonl(tmp_path / "d.jsonl", [{"id": "a", "messages": message}, {"id": "b", "messages": message}])
    pinned = pin_dataset(DatasetRef(path))
    with monkeypatch.context() as patched:
        patched.setattr(pins, "pin_dataset", lambda *_, **__: pytest.fail("an unchanged file's lines were read"))
        assert pins.dataset_changes(DatasetRef(path), pinned) is None
    _jsonl(path, [{"id": "a", "messages": message}, {"id": "b2", "messages": message}])
    assert pins.dataset_changes(DatasetRef(path), pinned) == "1 line edited (line 2 (id 'b2'))"
    path.write_bytes(path.read_bytes().replace(b"b2", b"b"))  # the same bytes again
    assert pins.dataset_changes(DatasetRef(path), pinned) is None
    # Same size, same lines, one byte changed where the parsed line is the same: still named (by the bytes).
    path.write_bytes(path.read_bytes().replace(b'{"id"', b'{ "id"', 1)[:-1])
    assert "the bytes differ" in (pins.dataset_changes(DatasetRef(path), pinned) or "")


# --- every problem named; numbers from 1 ----------------------------------------------------------------------


def test_a_refused_line_names_every_problem_it_has(tmp_path: Path) -> None:
    obj = {
        "id": 12.5,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "narrator", "content": "n"},
            "hi",
        ],
        "tools": [{"type": "retrieval"}],
    }
    prompt_id, problem = validate_prompt(obj)
    assert prompt_id is None and problem is not None
    parts = problem.reason.split("; ")
    assert problem.cause == BAD_ID  # the first problem's
    assert parts[0] == "id must be a JSON string or an integer, got number 12.5"
    assert f"message 3 (messages[2]) has role 'narrator'; {EXPECTED}" in problem.reason
    assert "message 4 (messages[3]) is not an object, got string" in problem.reason
    assert parts[-1] == 'tools[0].type must be "function", got "retrieval"'
    # The scan sets the line aside once, with that reason.
    _, (aside,) = _scan(_jsonl(tmp_path / "d.jsonl", [obj]))
    assert (aside.cause, aside.reason) == (BAD_ID, problem.reason)
    # A good id and bad tools: the tools' cause, the id kept.
    assert validate_prompt({**obj, "id": "p", "messages": obj["messages"][:2]}) == (
        "p",
        line_shape.Problem(INVALID_TOOLS, 'tools[0].type must be "function", got "retrieval"'),
    )


def test_many_bad_messages_are_named_up_to_a_few_then_counted() -> None:
    obj = {"id": "p", "messages": [{"role": f"r{i}"} for i in range(6)]}
    _, problem = validate_prompt(obj)
    assert problem is not None and problem.cause == UNKNOWN_SHAPE
    assert "message 1 (messages[0])" in problem.reason and "message 3 (messages[2])" in problem.reason
    assert "message 4" not in problem.reason and problem.reason.endswith("; and 3 more bad messages")


def test_numbers_in_reasons_count_from_one(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "d.jsonl",
        [{"id": "a", "messages": [{"role": "user", "content": "q"}]}, b"", {"id": "b", "messages": [{"role": "x"}]}],
    )
    summary = dataset_summary(DatasetRef(path))
    assert summary.examples == {UNKNOWN_SHAPE: f"line 3: message 1 (messages[0]) has role 'x'; {EXPECTED}"}
    (aside,) = _scan(path)[1]
    assert aside.position == 2 and aside.key == "line:3"  # positions stay 0-based; what a person reads is 1-based


# --- JSON array files -----------------------------------------------------------------------------------------


def _tricky_elements(count: int) -> list[Any]:
    """Conversations whose strings hold every byte the span finder reacts to: brackets, commas, escaped quotes and
    backslashes, unicode; nested objects and arrays; elements of very different sizes."""
    rng = random.Random(5)
    pieces = ['"', "\\", "[", "]", "{", "}", ",", '\\"', "\\\\", "é", "日本", "\n", "\t", " ", "x" * 50, '"]}', "\\]"]
    out: list[Any] = []
    for i in range(count):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 40)))
        messages: list[Any] = [{"from": "human", "value": text}, {"from": "gpt", "value": text[::-1]}]
        if i % 3 == 0:
            messages = [{"role": "user", "content": text, "meta": {"nested": [[1, {"a": [text]}], []]}}]
        out.append({"id": f"e{i}", "conversations": messages, "n": [i, -1.5e3, True, None]})
    return out


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 64, 1 << 20])
@pytest.mark.parametrize("indent", [False, True])
def test_a_json_array_is_read_element_by_element_across_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int, indent: bool
) -> None:
    elements = _tricky_elements(60)
    body = orjson.dumps(elements, option=orjson.OPT_INDENT_2 if indent else 0)
    path = tmp_path / "d.json"
    path.write_bytes(b"  \n" + body + b"\n")
    monkeypatch.setattr(json_array, "JSON_CHUNK_SIZE", chunk_size)
    assert detect_format(path, "auto") == "json"
    scan = ShardScan(DatasetRef(path), 0, 1)
    items = list(scan)
    assert scan.format == "json" and (scan.lines_total, scan.valid_lines_total) == (60, 60)
    assert [(ref.position, ref.id, obj) for ref, obj in items] == [(i, e["id"], e) for i, e in enumerate(elements)]
    raw = path.read_bytes()
    for ref, obj in items:
        assert orjson.loads(raw[ref.offset : ref.offset + ref.length]) == obj
        assert (
            raw[ref.offset : ref.offset + 1] == b"{"
            and raw[ref.offset + ref.length - 1 : ref.offset + ref.length] == b"}"
        )
    # ShardPlan.load reads each prompt back by its offset (seek + read), normalised.
    plan = plan_shard(DatasetRef(path), 0, 1)
    loaded = list(plan.iter_prompts())
    assert [p.id for p in loaded] == [e["id"] for e in elements]
    assert loaded[1].messages == [
        {"role": "user", "content": elements[1]["conversations"][0]["value"]},
        {"role": "assistant", "content": elements[1]["conversations"][1]["value"]},
    ]
    assert loaded[0].messages == elements[0]["conversations"]


def test_the_span_finder_agrees_with_orjson_for_any_read_size() -> None:
    import io

    rng = random.Random(9)
    values: list[Any] = [1, -2.5, "s", '"[,]"', None, True, [], {}, [[["]"]]], {"a": {"b": ["{", "}"]}}]
    for _ in range(30):
        array = [rng.choice(values) for _ in range(rng.randrange(0, 8))] + _tricky_elements(rng.randrange(0, 3))
        body = orjson.dumps(array)
        for chunk_size in (1, 2, 5, 13, 4096):
            items = list(iter_json_array(io.BytesIO(body), "mem", chunk_size))
            elements = [item for item in items if not isinstance(item, ArrayBreak)]
            assert len(elements) == len(items)  # no break in a valid array
            assert [value for _, _, value in elements] == array
            for offset, data, value in elements:
                assert body[offset : offset + len(data)] == data and orjson.loads(data) == value
    # An invalid one ends with its break, whatever the read size.
    for chunk_size in (1, 3, 4096):
        *before, last = iter_json_array(io.BytesIO(b'[1, "a,]", {"b": [2]}, tru'), "mem", chunk_size)
        assert [item[2] for item in before if not isinstance(item, ArrayBreak)] == [1, "a,]", {"b": [2]}]
        assert isinstance(last, ArrayBreak) and last.offset == 23 and last.excerpt == b"tru"


@pytest.mark.parametrize("chunk_size", [1, 5, 1 << 20])
def test_a_truncated_array_keeps_the_elements_before_the_break(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int
) -> None:
    monkeypatch.setattr(json_array, "JSON_CHUNK_SIZE", chunk_size)
    elements = _tricky_elements(5)
    body = orjson.dumps(elements)
    cut = body.rindex(b'{"id":"e4"') + 20  # inside the fifth element
    path = tmp_path / "d.json"
    path.write_bytes(body[:cut])
    scan = ShardScan(DatasetRef(path), 0, 1)
    items = list(scan)
    assert [ref.id for ref, _ in (i for i in items if not isinstance(i, MalformedLine))] == ["e0", "e1", "e2", "e3"]
    (broken,) = [i for i in items if isinstance(i, MalformedLine)]
    assert (broken.position, broken.cause, scan.lines_total) == (4, BAD_JSON, 5)
    offset = body.rindex(b'{"id":"e4"')
    assert broken.reason == (
        f"bad JSON: the array breaks at element 5 (byte offset {offset}): the array ends at byte offset {cut} before "
        "its closing ] (truncated?); it and everything after it are set aside"
    )
    assert broken.excerpt.startswith('{"id":"e4"')
    assert dataset_summary(DatasetRef(path)).examples[BAD_JSON].startswith("element 5: bad JSON")


@pytest.mark.parametrize(
    ("body", "valid", "where"),
    [
        (
            b'[{"id": "a", "messages": [{"role": "tool"}]}, NaN, {"id": "b"}]',
            1,
            "at element 2 (byte offset 46): unexpected character",
        ),
        (b'[{"id": "a", "messages": [{"role": "tool"}]}] trailing', 1, "text after the array's closing ] at byte"),
        (
            b'[{"id": "a", "messages": [{"role": "tool"}]}, 1}, 2]',
            1,
            "at element 2 (byte offset 46): a } at byte offset 47 closes nothing",
        ),
        (b'[{"id": "a", "messages": [{"role": "tool"}]},]', 1, "at element 2 (byte offset 45): Input is a zero-length"),
        (b"[", 0, "before its closing ]"),
    ],
)
def test_an_invalid_array_is_read_up_to_where_it_breaks(tmp_path: Path, body: bytes, valid: int, where: str) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(body)
    prompts, aside = _scan(path)
    assert len(prompts) == valid
    assert [item.cause for item in aside] == [BAD_JSON]
    assert where in aside[0].reason and aside[0].position == valid


def test_json_arrays_with_a_bom_empty_ones_and_non_objects(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(UTF8_BOM + b'\n [{"id": "a", "messages": [{"role": "user", "content": "q"}]}, 3, "s"]')
    assert detect_format(path, "auto") == "json"
    prompts, aside = _scan(path)
    assert prompts[0][0].offset == len(UTF8_BOM) + 3 and prompts[0][0].id == "a"
    assert [(item.position, item.cause) for item in aside] == [(1, NOT_OBJECT), (2, NOT_OBJECT)]
    (loaded,) = plan_shard(DatasetRef(path), 0, 1).iter_prompts()
    assert loaded.messages == [{"role": "user", "content": "q"}]
    path.write_bytes(b" [ ] ")
    scan = ShardScan(DatasetRef(path), 0, 1)
    assert list(scan) == [] and scan.lines_total == 0
    # Declared json, but not an array: refused as a whole, by name.
    path.write_bytes(b'{"id": "a"}\n')
    with pytest.raises(DatasetError, match="is not a JSON array"):
        list(ShardScan(DatasetRef(path, "json"), 0, 1))


def test_jsonl_whose_first_line_is_an_array_stays_jsonl(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [[1, 2], {"id": "a", "messages": [{"role": "user", "content": "q"}]}])
    assert detect_format(path, "auto") == "jsonl"
    prompts, aside = _scan(path)
    assert [ref.id for ref, _ in prompts] == ["a"] and [item.cause for item in aside] == [NOT_OBJECT]
    path.write_bytes(b'[{"id": "a", "messages": [{"role": "user", "content": "q"}]}]\n')  # one line, one array
    assert detect_format(path, "auto") == "json"
    path.write_bytes(b'[\n  {"id": "a",\n "messages": []}\n]\n')
    assert detect_format(path, "auto") == "json"


def test_the_pin_of_a_json_array_is_one_hash_per_element(tmp_path: Path) -> None:
    elements = _tricky_elements(6)
    path = tmp_path / "d.json"
    path.write_bytes(orjson.dumps(elements, option=orjson.OPT_INDENT_2))
    pin = pin_dataset(DatasetRef(path))
    assert pin.format == "json" and pin.lines == 6
    assert pin.line_hashes.tolist() == [prompt_hash(obj) for _, obj in _scan(path)[0]]  # as the feeder hashes them
    edited = [*elements]
    edited[2] = {**edited[2], "id": "e2-new"}
    path.write_bytes(orjson.dumps(edited, option=orjson.OPT_INDENT_2))
    assert pin_changes(pin, pin_dataset(DatasetRef(path))) == "1 line edited (element 3 (id 'e2-new'))"
    path.write_bytes(orjson.dumps(elements)[:-30])  # truncated: the rest is one line
    truncated = pin_dataset(DatasetRef(path))
    scan = ShardScan(DatasetRef(path), 0, 1)
    list(scan)
    assert truncated.lines == scan.lines_total == 6


# --- Parquet --------------------------------------------------------------------------------------------------


def test_a_parquet_conversations_column_works_like_messages(tmp_path: Path) -> None:
    table = pa.table(
        {
            "uuid": [1, 2, 3],
            "conversations": [
                [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}],
                [{"from": "system", "value": "s"}, {"from": "human", "value": "x"}],
                [{"from": "narrator", "value": "n"}],
            ],
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    plan = plan_shard(DatasetRef(path, id_field="uuid"), 0, 1)
    prompts = list(plan.iter_prompts())
    assert [p.id for p in prompts] == ["1", "2"]  # an integer column: its decimal strings
    assert prompts[0].messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    (aside,) = plan.malformed
    assert aside.cause == UNKNOWN_SHAPE and "message 1 (conversations[0]) has from 'narrator'" in aside.reason
    # Conversations stored as JSON text; no id column: derived ids, as for JSONL.
    text = [orjson.dumps([{"from": "human", "value": "q"}]).decode()]
    pq.write_table(pa.table({"conversations": text}), path)
    (prompt,) = plan_shard(DatasetRef(path), 0, 1).iter_prompts()
    assert prompt.messages == [{"role": "user", "content": "q"}]
    assert prompt.id == _derived([{"role": "user", "content": "q"}])


# --- a dataset mostly of another shape ------------------------------------------------------------------------


def test_a_dataset_mostly_of_an_unknown_shape_is_refused(tmp_path: Path) -> None:
    good = {"id": "g", "messages": [{"role": "user", "content": "q"}]}
    lines = [{"instruction": f"i{i}", "output": "o"} for i in range(3)] + [good, {**good, "id": "h"}, b""]
    path = _jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(UnknownDatasetShape) as refused:
        check_dataset(DatasetRef(path))
    message = str(refused.value)
    assert message.startswith(f"spec.dataset.path {path}: 3 of 5 lines are of an unknown shape")
    assert "(e.g. line 1: no messages or conversations: the object has keys 'instruction', 'output';" in message
    assert isinstance(refused.value, DatasetError)
    # The same verdict from a plan already read (the preflight's), without a second pass.
    with pytest.raises(UnknownDatasetShape, match=re.escape(message)):
        check_plan(plan_shard(DatasetRef(path), 0, 1))
    # Half or fewer: the run goes on, those lines set aside.
    path = _jsonl(tmp_path / "half.jsonl", lines[1:])
    assert check_dataset(DatasetRef(path)).set_aside == {UNKNOWN_SHAPE: 2}
    assert check_plan(plan_shard(DatasetRef(path), 0, 1)) == check_dataset(DatasetRef(path))


def test_ref_offsets_of_jsonl_sharegpt_lines_load_back(tmp_path: Path) -> None:
    values = ["q" + str(i) + ' ]}\\"' for i in range(20)]
    lines = [{"conversations": [{"from": "human", "value": value}]} for value in values]
    path = _jsonl(tmp_path / "d.jsonl", lines)
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert len(plan.prompts) == 20
    raw = path.read_bytes()
    for ref in plan.prompts:
        assert orjson.loads(raw[ref.offset : ref.offset + ref.length]) == lines[ref.position]
    assert [p.messages for p in plan.iter_prompts()] == [[{"role": "user", "content": value}] for value in values]
