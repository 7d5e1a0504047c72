"""Injected faults and misconfigured-model modes, over real HTTP."""

from __future__ import annotations

import asyncio
import http.client
import re
import socket

import aiohttp
import pytest

from tests.harness.sim import SimServer
from tests.sim.http import generate, get, post
from tests.sim.prompts import IM_END, THINK, THINK_END, chat_prompt, decode, encode

BODY = {"input_ids": chat_prompt("faults"), "sampling_params": {"max_new_tokens": 4096}}


def test_5xx_fault(fleet: dict[str, SimServer]) -> None:
    reply = post(fleet["fault_5xx"].url, "/generate", BODY)
    assert reply.status == 503 and "Simulated" in reply.json()["error"]["message"]
    chat = post(fleet["fault_5xx"].url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert chat.status == 503
    assert get(fleet["fault_5xx"].url, "/health").status == 200, "faults hit generation, not health"


def test_a_partial_5xx_rate_fails_some_requests_and_a_retry_can_succeed(fleet: dict[str, SimServer]) -> None:
    statuses = [post(fleet["fault_half"].url, "/generate", BODY).status for _ in range(40)]
    assert set(statuses) == {200, 500}
    assert 8 <= statuses.count(500) <= 32


def test_connection_reset_mid_response(fleet: dict[str, SimServer]) -> None:
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        post(fleet["fault_reset"].url, "/generate", BODY)


def test_connection_reset_mid_stream(fleet: dict[str, SimServer]) -> None:
    async def read_stream() -> bytes:
        url = f"{fleet['fault_reset'].url}/generate"
        async with aiohttp.ClientSession() as session, session.post(url, json={**BODY, "stream": True}) as reply:
            assert reply.status == 200
            return await reply.read()

    with pytest.raises(aiohttp.ClientError):
        asyncio.run(read_stream())


def test_error_event_mid_stream_then_done(fleet: dict[str, SimServer]) -> None:
    events = post(fleet["fault_stream_error"].url, "/generate", {**BODY, "stream": True}).events()
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert set(error) == {"message", "type", "code", "retryable"} and error["retryable"] is False
    assert all("output_ids" in event for event in events[:-2]) and len(events) > 3
    assert all(event["meta_info"]["finish_reason"] is None for event in events[:-2])


def test_abort_finish_reason_with_partial_output(fleet: dict[str, SimServer]) -> None:
    # Streamed, the abort is the last result chunk (non-streaming it is an HTTP error: test_fidelity.py).
    result = post(fleet["fault_abort"].url, "/generate", {**BODY, "stream": True}).events()[-2]
    finish = result["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and finish["status_code"] == 500 and finish["message"]
    assert len(result["output_ids"]) == result["meta_info"]["completion_tokens"]
    assert IM_END not in result["output_ids"]


def test_hang_keeps_the_client_waiting(fleet: dict[str, SimServer]) -> None:
    with pytest.raises((TimeoutError, socket.timeout)):
        post(fleet["fault_hang"].url, "/generate", BODY, timeout_s=0.5)
    assert get(fleet["fault_hang"].url, "/health").status == 200


def test_prompt_suffix_leak_puts_prompt_tokens_in_output_ids(fleet: dict[str, SimServer]) -> None:
    prompt = chat_prompt("leak")
    result = generate(fleet["leak"].url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096}})
    ids = result["output_ids"]
    assert ids[:3] == prompt[-3:]
    assert len(ids) == result["meta_info"]["completion_tokens"] + 3, "the bug: counts disagree"
    streamed = post(fleet["leak"].url, "/generate", {"input_ids": prompt, "stream": True}).events()[-2]
    assert streamed["output_ids"][:3] == prompt[-3:]


def test_never_close_think(fleet: dict[str, SimServer]) -> None:
    ids = generate(fleet["never_close_think"].url, BODY)["output_ids"]
    assert THINK_END not in ids and ids[-1] == IM_END


def test_kimi_tags_misconfig_writes_old_kimi_tags(fleet: dict[str, SimServer]) -> None:
    result = generate(fleet["kimi_tags"].url, BODY)
    assert THINK_END not in result["output_ids"] and result["text"].count("◁/think▷") == 1
    unprompted = generate(
        fleet["kimi_tags"].url, {"input_ids": encode("Hi"), "sampling_params": {"max_new_tokens": 999}}
    )
    assert unprompted["text"].startswith("◁think▷") and THINK not in unprompted["output_ids"]
    reasoning = post(fleet["kimi_tags"].url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert reasoning.json()["choices"][0]["message"]["content"] == "", "kimi_k2 takes it all for reasoning"


def test_ignore_thinking_misconfig_never_reasons(fleet: dict[str, SimServer]) -> None:
    ids = generate(fleet["ignore_thinking"].url, BODY)["output_ids"]
    assert THINK_END not in ids and THINK not in ids and ids[-1] == IM_END
    assert "</think>" not in decode(ids)


def test_gpu_speed_queues_requests_beyond_the_batch_capacity(fleet: dict[str, SimServer]) -> None:
    server = fleet["gpu"]  # --max-running-requests 1, 100 tokens/s per request
    info = get(server.url, "/server_info").json()
    assert info["max_running_requests"] == 1
    assert [s["effective_max_running_requests_per_dp"] for s in info["internal_states"]] == [1]
    body = {"input_ids": chat_prompt(thinking=False), "sampling_params": {"max_new_tokens": 30}}

    def gauge(name: str) -> float:
        match = re.search(rf"^sglang:{name}\{{.*\}} (\S+)$", get(server.url, "/metrics").body.decode(), re.M)
        assert match, name
        return float(match.group(1))

    async def scenario() -> list[int]:
        async with aiohttp.ClientSession() as session:

            async def call() -> int:
                async with session.post(f"{server.url}/generate", json=body) as reply:
                    return len((await reply.json())["output_ids"])

            calls = [asyncio.create_task(call()) for _ in range(3)]
            seen = set()
            while not all(task.done() for task in calls):
                seen.add(
                    (
                        await asyncio.to_thread(gauge, "num_running_reqs"),
                        await asyncio.to_thread(gauge, "num_queue_reqs"),
                    )
                )
                await asyncio.sleep(0.05)
            assert (1.0, 2.0) in seen or (1.0, 1.0) in seen, seen
            assert all(running <= 1 for running, _ in seen)
            return [await task for task in calls]

    assert asyncio.run(scenario()) == [30, 30, 30]
