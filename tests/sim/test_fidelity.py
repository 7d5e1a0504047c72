"""The simulator behaves as SGLang 0.5.23 does where our gate depends on it (docs/sglang-fidelity.md).

Parser names in /server_info as resolved; memory-derived sizes that differ per replica; the context-length
400 instead of a shortened answer; connection refused while loading, then 503 while warming up; in-stream
errors and aborts in SGLang's shapes. (Request validation is held to SGLang's own code in tests/contract.)
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from tests.harness.processes import wait_until
from tests.harness.sim import SimServer, health_status
from tests.sim.conftest import SHORT
from tests.sim.http import get, post
from tests.sim.prompts import chat_prompt


def test_server_info_reports_parser_names_as_sglang_resolves_them(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25", *SHORT)
    info = get(server.url, "/server_info").json()
    assert (info["reasoning_parser"], info["tool_call_parser"]) == ("qwen3", "qwen")


def test_memory_derived_sizes_differ_per_replica_and_bound_the_input(
    sims_factory: Callable[..., list[SimServer]],
) -> None:
    first, second = sims_factory(SHORT, SHORT)
    infos = [get(server.url, "/server_info").json() for server in (first, second)]
    assert infos[0]["max_total_num_tokens"] != infos[1]["max_total_num_tokens"]
    for info in infos:
        assert info["context_length"] is None, "null unless launched with --context-length, as in SGLang"
        context = 262_144  # the stand-in's max_position_embeddings
        capacity = info["max_total_num_tokens"]
        assert capacity > context
        assert info["max_req_input_len"] == min(context - 1, capacity - 1) - 5


def test_context_length_overrun_is_a_400_with_sglangs_message(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--context-length", "4096", *SHORT)
    prompt = chat_prompt()
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4097 - len(prompt)}}
    reply = post(server.url, "/generate", body)
    assert reply.status == 400
    assert reply.json()["error"]["message"] == (
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total "
        f"of 4097 tokens: {len(prompt)} tokens from the input messages and {4097 - len(prompt)} tokens for the "
        "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
        "the limit."
    )
    fits = post(server.url, "/generate", {**body, "sampling_params": {"max_new_tokens": 4096 - len(prompt)}})
    assert fits.status == 200
    info = get(server.url, "/server_info").json()
    assert info["context_length"] == 4096 and info["max_req_input_len"] == 4090


def test_the_scheduler_refuses_an_input_at_max_req_input_len(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--context-length", "4096", *SHORT)
    body = {"input_ids": [100] * 4090, "sampling_params": {"max_new_tokens": 1}}
    reply = post(server.url, "/generate", body)
    assert reply.status == 400 and reply.json()["error"]["message"].startswith("Input length (4090 tokens) exceeds")
    events = post(server.url, "/generate", {**body, "stream": True}).events()
    assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["status_code"] == 400
    assert post(server.url, "/generate", {**body, "input_ids": [100] * 4089}).status == 200


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_connection_refused_while_loading_then_503_while_warming_up(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--sim-load-seconds", "6", *SHORT, wait_ready=False)
    assert _refused(server.port), "the port must not accept connections while weights load"
    wait_until(
        lambda: health_status(server.url, timeout_s=1) is not None, timeout=60, describe="an answer", interval=0.05
    )
    for path in ("/health", "/health_generate"):
        reply = get(server.url, path)
        assert (reply.status, reply.body) == (503, b"")
    generate = post(server.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    assert (generate.status, generate.body) == (503, b"")
    server.wait_ready(timeout_s=30)
    assert get(server.url, "/health").status == 200


def test_in_stream_error_is_not_retryable(fleet: dict[str, SimServer]) -> None:
    body = {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 64}, "stream": True}
    events = post(fleet["fault_stream_error"].url, "/generate", body).events()
    assert events[-1] == "[DONE]"
    assert events[-2] == {
        "error": {"message": events[-2]["error"]["message"], "type": "invalid_request_error", "code": 400,
                  "retryable": False}
    }  # fmt: skip


def test_non_streaming_abort_is_an_http_error_as_sglang_answers_it(fleet: dict[str, SimServer]) -> None:
    reply = post(fleet["fault_abort"].url, "/generate", {"input_ids": chat_prompt(), "sampling_params": {}})
    # A scheduler abort with status 500 reaches the client as FastAPI's HTTPException through SGLang's handler.
    assert reply.status == 500
    assert reply.json() == {
        "object": "error", "message": reply.json()["message"], "type": "500", "param": None, "code": 500
    }  # fmt: skip


def test_deterministic_inference_seeds_unseeded_requests_with_42(sim_factory: Callable[..., SimServer]) -> None:
    """SGLang gives an unseeded request seed 42 under --enable-deterministic-inference (sampling_batch_info.py)."""
    server = sim_factory("--enable-deterministic-inference", *SHORT)
    prompt = chat_prompt()

    def output(**sampling: int) -> list[int]:
        reply = post(
            server.url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 64, **sampling}}
        )
        assert reply.status == 200
        ids: list[int] = reply.json()["output_ids"]
        return ids

    assert output() == output(sampling_seed=42)
    assert output() != output(sampling_seed=7)
    assert output(sampling_seed=7) == output(sampling_seed=7), "a seed gives one output per prompt"
