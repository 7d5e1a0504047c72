"""engine.wire: output_ids kept as the server's bytes give the same records and flags as parsed ints."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from datagen_operator.checks.record_checks import Expectations, inspect_record
from datagen_operator.engine.client.generate import parse_generate_body
from datagen_operator.engine.wire import WireIds, compact_int_array, cut_array, join, split_answer
from datagen_operator.output.records import Answer, build_record, encode_record
from datagen_operator.prompts.job import Job
from tests.streams import read_chunks

THINK, END, IM_END, SECTION_BEGIN, SECTION_END = 163606, 163607, 163586, 163595, 163596
# Ids that are substrings of each other, zero, and the markers: the byte searches must tell them apart.
ALPHABET = (0, 1, 5, 7, 10, 15, 51, 105, 1051, 16360, 63607, THINK, END, IM_END, SECTION_BEGIN, SECTION_END)
EXPECTATIONS = (
    Expectations(True, (THINK,), END, frozenset({IM_END}), ((SECTION_BEGIN, SECTION_END),), True),
    Expectations(True, (THINK,), END, frozenset({IM_END}), ((SECTION_BEGIN, SECTION_END),), False),
    Expectations(False, (THINK,), END, frozenset({IM_END})),
    Expectations(True, (5, 105, 7), END, frozenset({IM_END, 0})),  # a multi-token opener (harmony-like)
    Expectations(True, (), None, frozenset({1})),
)
PROMPTS = ([1, 2, THINK], [1, 2, 3], [5, 105], [1, THINK, END])


def random_ids(rng: random.Random) -> list[int]:
    n = rng.choice((0, 1, 2, 3, rng.randrange(4, 40), rng.randrange(40, 3000)))
    ids = [rng.choice(ALPHABET) if rng.random() < 0.7 else rng.randrange(0, 200_000) for _ in range(n)]
    if ids and rng.random() < 0.5:
        ids[-1] = IM_END
    return ids


def bodies(ids: list[int], rng: random.Random) -> list[bytes]:
    """The same answer in the shapes a server can send: orjson's compact form first."""
    meta = {
        "finish_reason": rng.choice(({"type": "stop", "matched": IM_END}, {"type": "length", "length": 9}, None)),
        "completion_tokens": len(ids) + rng.choice((0, 0, 0, -2, 3)),
        "prompt_tokens": 3,
        "cached_tokens": 0,
    }
    text = rng.choice(("plain", 'quoted "output_ids":[1,2]', "back\\slash ]"))
    answer = {"text": text, "output_ids": ids, "meta_info": meta}
    reordered = {"meta_info": meta, "output_ids": ids, "text": text}
    return [
        orjson.dumps(answer),
        orjson.dumps(reordered),
        orjson.dumps([answer]),
        json.dumps(answer).encode(),  # spaces: the parsing path
        json.dumps(answer, separators=(",", ":")).encode(),
    ]


def record_line(ids: Any, meta: dict[str, Any], raw: bytes | None, prompt: list[int], expect: Expectations) -> bytes:
    job = Job(0, "q1", 0, prompt, True, 0)
    flags = inspect_record(prompt, ids, meta.get("finish_reason"), meta.get("completion_tokens"), True, expect)
    record = build_record(job, Answer(ids, meta, "http://s", 1, 0.5), flags, "run-uid")
    return encode_record(record, raw)


def fast_or_present(body: bytes) -> tuple[Any, dict[str, Any], bytes | None]:
    """What the client does with the fast path: the bytes when they apply, else the present parse."""
    split = split_answer(body)
    if split is None:
        return parse_generate_body(body)
    ids, obj = split
    meta = obj.get("meta_info")
    return ids, meta if isinstance(meta, dict) else {}, ids.raw


def test_both_paths_give_identical_records_over_many_bodies() -> None:
    rng = random.Random(16)
    fast = 0
    for _ in range(100):
        ids = random_ids(rng)
        for body in bodies(ids, rng):
            present = parse_generate_body(body)
            wire = fast_or_present(body)
            fast += isinstance(wire[0], WireIds)
            for prompt in PROMPTS:
                for expect in EXPECTATIONS:
                    # Fresh views: each check sequence must hold from a clean state, not a cached list.
                    view = WireIds(wire[0].raw) if isinstance(wire[0], WireIds) else wire[0]
                    assert record_line(view, wire[1], wire[2], prompt, expect) == record_line(
                        *present, prompt, expect
                    ), (body[:200], prompt, expect)
            assert (
                orjson.loads(record_line(wire[0], wire[1], wire[2], PROMPTS[0], EXPECTATIONS[0]))["output_ids"] == ids
            )
    assert fast >= 100 * 3  # the compact bodies all took the bytes path


def test_views_answer_like_lists() -> None:
    rng = random.Random(7)
    for _ in range(400):
        ids = random_ids(rng)
        view = WireIds(orjson.dumps(ids))
        assert len(view) == len(ids) and bool(view) == bool(ids)
        if ids:
            assert view[0] == ids[0] and view[-1] == ids[-1] and view[len(ids) - 1] == ids[-1]
        for value in (*ALPHABET, 2, -1, 99):
            assert view.count(value) == ids.count(value), (ids, value)
            assert (value in view) == (value in ids)
            for start, stop in ((0, None), (1, None), (2, 5), (0, -1), (len(ids) // 2, None), (-3, None)):
                fresh = WireIds(view.raw)
                try:
                    expected = ids.index(value, start, len(ids) if stop is None else stop)
                except ValueError:
                    with pytest.raises(ValueError):
                        fresh.index(value, start, stop)
                    continue
                assert fresh.index(value, start, stop) == expected
                # A short slice from the hit (the multi-token opener check) is read from the bytes.
                assert fresh[expected : expected + 3] == ids[expected : expected + 3]
                assert fresh[expected] == ids[expected]
        for stop in (0, 1, 2, 8, 64, 65):
            assert WireIds(view.raw)[:stop] == ids[:stop]
        assert WireIds(view.raw)[3:9] == ids[3:9] and WireIds(view.raw)[::2] == ids[::2]
        assert view == ids and view.tolist() == ids


@pytest.mark.parametrize(
    "raw",
    [b"[1, 2]", b"[01,2]", b"[1,02]", b"[-1]", b"[1e3]", b"[1.0]", b"[,1]", b"[1,]", b"[1,,2]", b"[ ]", b'["1"]'],
)
def test_only_compact_int_arrays_take_the_bytes_path(raw: bytes) -> None:
    assert compact_int_array(raw) == -1
    assert split_answer(b'{"output_ids":' + raw + b',"meta_info":{}}') is None


def test_arrays_that_do_take_the_bytes_path() -> None:
    for ids in ([], [0], [0, 0], [10, 0], [0, 1], [7, 163607, 0]):
        assert compact_int_array(orjson.dumps(ids)) == len(ids), ids
    assert split_answer(b'{"output_ids":[],"meta_info":{}}') == (WireIds(b"[]"), {"output_ids": [], "meta_info": {}})


def test_a_key_inside_a_string_is_not_cut() -> None:
    # The text holds `"output_ids":[9]` escaped; the cut must be the real key or decline.
    body = orjson.dumps({"text": '"output_ids":[9]', "output_ids": [1, 2], "meta_info": {}})
    ids, obj = split_answer(body) or (None, None)
    assert ids == [1, 2] and obj is not None and obj["text"] == '"output_ids":[9]'
    assert cut_array(b'{"text":"output_ids"}') is None
    # A key-like string cut by mistake leaves the real array in the rest: declined.
    assert split_answer(b'{"a":{"output_ids":[9]},"output_ids":[1]}') is None


def test_streamed_deltas_joined_as_bytes_equal_the_parsed_stream() -> None:
    rng = random.Random(3)
    for _ in range(200):
        ids = random_ids(rng)
        cuts = sorted(rng.sample(range(len(ids) + 1), min(len(ids) + 1, rng.randrange(1, 6))))
        deltas = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
        events = [
            b"data: " + orjson.dumps({"output_ids": d, "meta_info": {"finish_reason": None}}) + b"\n\n" for d in deltas
        ]
        events.append(b'data: {"output_ids":[],"meta_info":{"finish_reason":{"type":"stop"}}}\n\ndata: [DONE]\n\n')
        parsed, _ = read_chunks([b"".join(events)])
        pieces = []
        for delta in deltas:
            split = split_answer(orjson.dumps({"output_ids": delta, "meta_info": {}}))
            assert split is not None
            pieces.append(split[0])
        joined = join(pieces)
        assert joined == parsed == ids and orjson.loads(joined.raw) == ids
        assert join([*pieces[:1], ids[len(pieces[0]) :]]) == ids  # a parsed delta among byte ones
