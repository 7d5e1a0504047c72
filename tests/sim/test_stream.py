"""Streaming /generate: SSE chunks, cumulative by default, deltas with --incremental-streaming-output. Streamed
and plain answers of one prompt are compared greedy (temperature 0): SGLang samples each request anew."""

from __future__ import annotations

import itertools

import pytest

from tests.harness.sim import SimServer
from tests.sim.http import generate, post
from tests.sim.prompts import IM_END, chat_prompt


@pytest.fixture
def incremental_sim(fleet: dict[str, SimServer]) -> SimServer:
    return fleet["incremental"]


def stream(sim: SimServer, body: dict) -> list:
    reply = post(sim.url, "/generate", {**body, "stream": True})
    assert reply.status == 200, reply.body[:300]
    events = reply.events()
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def test_default_stream_is_cumulative_and_ends_like_the_plain_response(sim: SimServer) -> None:
    body = {"input_ids": chat_prompt("stream"), "sampling_params": {"max_new_tokens": 4096, "temperature": 0}}
    plain = generate(sim.url, body)
    events = stream(sim, body)
    assert len(events) == len(plain["output_ids"]), "one event per token (stream_interval 1)"
    for before, after in itertools.pairwise(events):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
        assert before["meta_info"]["finish_reason"] is None
    last = events[-1]
    assert last["output_ids"] == plain["output_ids"] and last["output_ids"][-1] == IM_END
    assert last["text"] == plain["text"]
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert last["meta_info"]["completion_tokens"] == len(last["output_ids"])
    assert "e2e_latency" in last["meta_info"] and "e2e_latency" not in events[0]["meta_info"]


def test_incremental_stream_sends_disjoint_deltas(incremental_sim: SimServer) -> None:
    body = {"input_ids": chat_prompt("deltas"), "sampling_params": {"max_new_tokens": 4096, "temperature": 0}}
    plain = generate(incremental_sim.url, body)
    events = stream(incremental_sim, body)
    assert [token for event in events for token in event["output_ids"]] == plain["output_ids"]
    assert "".join(event["text"] for event in events) == plain["text"]
    assert [event["meta_info"]["completion_tokens"] for event in events] == list(range(1, len(events) + 1))
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}


def test_stream_interval_groups_tokens(incremental_sim: SimServer) -> None:
    body = {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 10, "stream_interval": 4}}
    assert [len(event["output_ids"]) for event in stream(incremental_sim, body)] == [4, 4, 2]


def test_streamed_text_with_a_trimmed_stop_string_matches_the_plain_text(incremental_sim: SimServer) -> None:
    base = {"input_ids": chat_prompt("trim"), "sampling_params": {"max_new_tokens": 4096, "temperature": 0}}
    word = generate(incremental_sim.url, base)["text"].split()[5]
    body = {**base, "sampling_params": {"max_new_tokens": 4096, "temperature": 0, "stop": word}}
    plain = generate(incremental_sim.url, body)
    assert "".join(event["text"] for event in stream(incremental_sim, body)) == plain["text"]


def test_batch_stream_tags_events_with_their_index(sim: SimServer) -> None:
    body = {
        "input_ids": [chat_prompt("x"), chat_prompt("y")],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
    }
    plain = generate(sim.url, body)
    events = stream(sim, body)
    for index in (0, 1):
        mine = [event for event in events if event["index"] == index]
        assert len(mine) == 3 and mine[-1]["output_ids"] == plain[index]["output_ids"]


def test_validation_errors_come_before_the_stream(sim: SimServer) -> None:
    reply = post(sim.url, "/generate", {"input_ids": [1], "sampling_params": {"max_tokens": 3}, "stream": True})
    assert reply.status == 400 and isinstance(reply.json()["error"], str)


def test_cumulative_stream_of_a_long_answer_is_quadratic_in_ids(sim: SimServer) -> None:
    body = {"input_ids": chat_prompt(thinking=False), "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
    events = stream(sim, body)
    assert len(events) == 300
    total_ids = sum(len(event["output_ids"]) for event in events)
    assert total_ids == len(events) * (len(events) + 1) // 2, "field note 9: n(n+1)/2 ids for an n-token answer"
