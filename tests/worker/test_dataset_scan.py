"""The JSONL scan's shortcuts change no result: plain_prompt_id (the fast path) never accepts what
validate_prompt refuses, and ShardScan (the fast path, one shard skipping the id hash) gives
exactly what the plain reading of the rules below gives, item for item."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.engine.chat_tools import read_tools
from datagen_operator.prompts.dataset_ref import UTF8_BOM, DatasetRef
from datagen_operator.prompts.line_shape import DUPLICATE_ID, Problem, plain_prompt_id, validate_prompt
from datagen_operator.prompts.lines import MalformedLine, PromptRef
from datagen_operator.prompts.pin import DatasetPin, LinePins, pin_dataset
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.scan import ShardScan
from datagen_operator.prompts.shards import shard_of_id
from datagen_operator.prompts.summary import dataset_summary
from tests.worker.dataset_corpus import INVALID_TOOLS_CASES, VALID_TOOLS_CASES

IDS: list[Any] = ["p1", "", " ", 1, 0, True, 1.5, None, ["p1"], {"id": "p1"}]
MESSAGE: list[Any] = [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": None, "extra": [1]},
    {"role": 1, "content": "q"},
    {"role": None},
    {"content": "no role"},
    {},
    "user",
    None,
    [{"role": "user"}],
    {"role": "user"},  # SGLang refuses a user message without content
    {"role": "user", "content": [{"type": "text", "text": "q"}]},
    {"role": "tool", "content": [{"type": "text", "text": "r"}, {"type": "image_url", "image_url": {"url": "u"}}]},
    {"role": "system", "content": [{"type": "text", "value": "LLaMA-Factory's part"}]},
]
ABSENT = object()
TOOLS: list[Any] = [ABSENT, *VALID_TOOLS_CASES, *(tools for tools, _ in INVALID_TOOLS_CASES), "x", 3]


def _obj(prompt_id: Any, messages: Any, tools: Any, **extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {} if prompt_id is ABSENT else {"id": prompt_id}
    if messages is not ABSENT:
        obj["messages"] = messages
    if tools is not ABSENT:
        obj["tools"] = tools
    return {**obj, **extra}


def _corpus() -> list[Any]:
    """Every id x message-list x tools combination, random deeper shapes, and non-objects; round-tripped
    through JSON, as the scan sees them."""
    message_lists: list[Any] = [ABSENT, None, [], "m", {}, *([m] for m in MESSAGE)]
    message_lists += [[MESSAGE[0], m] for m in MESSAGE] + [[m, MESSAGE[0]] for m in MESSAGE]
    objs: list[Any] = [
        _obj(prompt_id, messages, tools)
        for prompt_id, messages, tools in itertools.product([ABSENT, *IDS], message_lists, TOOLS)
    ]
    rng = random.Random(16)
    for _ in range(3000):
        length = rng.choice([1, 1, 2, 3, 5])
        messages = [rng.choice(MESSAGE[:2]) if rng.random() < 0.9 else rng.choice(MESSAGE) for _ in range(length)]
        extra = {"metadata": {"tools": None}} if rng.random() < 0.2 else {}
        objs.append(_obj(rng.choice(["p1"] * 10 + IDS), messages, rng.choice([ABSENT] * 20 + TOOLS), **extra))
    objs += [[], [{"id": "p1"}], "p1", 1, None, True, 2.5]
    return [orjson.loads(orjson.dumps(obj)) for obj in objs]


def test_the_fast_path_accepts_only_what_validate_prompt_accepts_with_the_same_id() -> None:
    corpus = _corpus()
    fast = 0
    for obj in corpus:
        prompt_id = plain_prompt_id(obj)
        if prompt_id is not None:
            fast += 1
            assert validate_prompt(obj) == (prompt_id, None), obj
    accepted = sum(validate_prompt(obj)[1] is None for obj in corpus)
    # Not vacuous: the common shape takes the fast path, and validate_prompt still sees the rest.
    assert 500 < fast < accepted < len(corpus) - 1000
    assert plain_prompt_id({"id": "p", "messages": [{"role": "user", "content": "q"}]}) == "p"
    assert plain_prompt_id({"id": "p", "messages": [{"role": "user"}], "tools": []}) is None  # judged in full


def _reference(path: Path, shard_index: int, shard_count: int) -> tuple[list[Any], int, int]:
    """The rules, line by line and without shortcuts: every line through validate_prompt, every owner by
    the id's hash (else the line), a duplicate is a later valid line with an id seen before in this shard."""
    items: list[Any] = []
    seen: set[str] = set()
    valid = 0
    position = offset = 0
    with path.open("rb") as file:
        for line in file:
            if position == 0 and line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM) :]
                offset = len(UTF8_BOM)
            stripped = line.strip()
            if stripped:
                try:
                    obj = orjson.loads(stripped)
                except orjson.JSONDecodeError as error:
                    if position % shard_count == shard_index:
                        items.append(
                            MalformedLine(position, f"bad JSON: {error}", stripped.decode(errors="replace")[:200])
                        )
                else:
                    prompt_id, problem = validate_prompt(obj)
                    valid += problem is None
                    owner = shard_of_id(prompt_id, shard_count) if prompt_id is not None else position % shard_count
                    if owner == shard_index:
                        if problem is None and prompt_id in seen:
                            problem = Problem(DUPLICATE_ID, f"duplicate id {prompt_id!r} (first occurrence kept)")
                        if problem is not None:
                            excerpt = stripped.decode(errors="replace")[:200]
                            items.append(MalformedLine(position, problem.reason, excerpt, prompt_id, problem.cause))
                        else:
                            seen.add(prompt_id)
                            items.append((PromptRef(position, prompt_id, offset, len(line)), obj))
            position += 1
            offset += len(line)
    return items, position, valid


def _dataset(path: Path, bom: bool, final_newline: bool) -> Path:
    lines = [orjson.dumps(obj) for obj in _corpus()]
    rng = random.Random(7)
    lines += [orjson.dumps(_obj(f"dup{rng.randrange(40)}", [MESSAGE[0]], ABSENT)) for _ in range(200)]
    lines += [b"{not json", b"", b"   ", b'  {"id": "padded", "messages": [{"role": "tool"}]}\t', b"[1, 2]", b"\r"]
    lines += [orjson.dumps(_obj("crlf", [MESSAGE[0]], ABSENT)) + b"\r", b'{"id": "caf\xc3\xa9", "messages": 1}']
    # Whitespace bytes.strip cuts but JSON does not allow; a bad line padded with spaces (its error's column).
    lines += [b'\x0c{"id": "formfeed", "messages": [{"role": "tool"}]}\x0b', b"  \x0c ", b"   [1,,]  "]
    lines += [b"\xff\xfe not utf-8", orjson.dumps(_obj("long", [{"role": "user", "content": "x" * 5000}], ABSENT))]
    rng.shuffle(lines)
    lines.append(orjson.dumps(_obj("last", [MESSAGE[0]], ABSENT)))  # its length counts no newline without one
    path.write_bytes((UTF8_BOM if bom else b"") + b"\n".join(lines) + (b"\n" if final_newline else b""))
    return path


@pytest.mark.parametrize(("bom", "final_newline"), [(False, True), (True, False)])
def test_the_scan_gives_what_the_rules_give_line_by_line(tmp_path: Path, bom: bool, final_newline: bool) -> None:
    path = _dataset(tmp_path / "d.jsonl", bom, final_newline)
    for shard_count in (1, 3):
        for shard_index in range(shard_count):
            scan = ShardScan(DatasetRef(path), shard_index, shard_count)
            items = list(scan)
            expected, lines, valid = _reference(path, shard_index, shard_count)
            assert items == expected
            assert (scan.lines_total, scan.valid_lines_total) == (lines, valid)
            assert any(isinstance(item, MalformedLine) and item.cause == DUPLICATE_ID for item in items)
    # The summary (counts only, streamed) says what the whole-dataset reading says.
    expected, lines, _ = _reference(path, 0, 1)
    aside = [item for item in expected if isinstance(item, MalformedLine)]
    summary = dataset_summary(DatasetRef(path))
    assert (summary.lines, summary.prompts) == (lines, len(expected) - len(aside))
    assert summary.set_aside == Counter(item.cause for item in aside)
    assert summary.examples == {item.cause: f"line {item.position + 1}: {item.reason}" for item in reversed(aside)}
    # The offsets and lengths read each prompt back (the form-feed padded one included).
    plan = plan_shard(DatasetRef(path), 0, 1)
    loaded = list(plan.iter_prompts())
    assert [prompt.id for prompt in loaded] == [ref.id for ref in plan.prompts]
    assert "formfeed" in {prompt.id for prompt in loaded}
    objs = [item[1] for item in ShardScan(DatasetRef(path), 0, 1) if not isinstance(item, MalformedLine)]
    assert [(prompt.messages, prompt.tools) for prompt in loaded] == [
        (obj["messages"], read_tools(obj.get("tools"))[0]) for obj in objs
    ]


@pytest.mark.parametrize(("bom", "final_newline"), [(False, True), (True, False)])
def test_the_pin_a_scan_makes_as_it_reads_is_pin_datasets(tmp_path: Path, bom: bool, final_newline: bool) -> None:
    """A worker without a pin pins the dataset by its plan's read (every line, every shard's): the same sha256
    and line hashes as reading the file for its pin, whichever shard reads it."""
    path = _dataset(tmp_path / "d.jsonl", bom, final_newline)
    expected = pin_dataset(DatasetRef(path))
    for shard_count in (1, 3):
        for shard_index in range(shard_count):
            made: list[DatasetPin] = []
            scan = ShardScan(DatasetRef(path), shard_index, shard_count)
            scan.lines = LinePins(DatasetRef(path), "2020-01-02", made.append)
            items = list(scan)
            assert items == _reference(path, shard_index, shard_count)[0]  # the scan itself unchanged
            (pin,) = made
            assert pin.summary() == {**expected.summary(), "rendered_on": "2020-01-02"}
            assert pin.line_hashes.tolist() == expected.line_hashes.tolist()
    # A read that stops early (a drained worker) hands over no pin.
    made = []
    scan = ShardScan(DatasetRef(path), 0, 1)
    scan.lines = LinePins(DatasetRef(path), "2020-01-02", made.append)
    next(iter(scan))
    assert not made


@pytest.mark.parametrize(
    ("body", "lines"),
    [
        (b"", 0),
        (UTF8_BOM, 1),
        (UTF8_BOM + b"\n", 1),
        (b"\n", 1),
        (b"\n\n ", 3),
        (b"{}", 1),
        (b'{"id": "a", "messages": [{"role": "tool"}]}', 1),
    ],
)
def test_line_counts_at_the_edges_match_the_rules(tmp_path: Path, body: bytes, lines: int) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(body)
    scan = ShardScan(DatasetRef(path), 0, 1)
    assert list(scan) == _reference(path, 0, 1)[0]
    assert scan.lines_total == _reference(path, 0, 1)[1] == lines
