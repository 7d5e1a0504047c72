"""Health, info and metrics endpoints; loading, shutdown, crash and restart."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from datagen_operator.engine.health import HEALTH_CHECK_TIMEOUT_ENV, HEALTH_POLL_S
from datagen_operator.presets.sglang_names import PINNED_SGLANG_VERSION
from tests.harness.processes import wait_until
from tests.harness.sim import SimServer, SimStartError, health_status
from tests.sim.http import generate, get, post
from tests.sim.prompts import chat_prompt


def test_health_endpoints_answer_200_with_an_empty_body(sim: SimServer) -> None:
    for path in ("/health", "/health_generate"):
        reply = get(sim.url, path)
        assert (reply.status, reply.body) == (200, b"")


def test_health_takes_a_second_and_answers_503_only_when_a_stall_outlasts_sglangs_timeout(
    sim_factory: Callable[..., SimServer],
) -> None:
    # SGLang's health call is a one-token generation looked at once a second (engine/health.py): 200 after a
    # second at least; during a stall of the scheduler 503 after SGLANG_HEALTH_CHECK_TIMEOUT while /generate
    # still takes requests, and answers them once the stall ends.
    server = sim_factory("--sim-fault-stall-s", "6", env={HEALTH_CHECK_TIMEOUT_ENV: "2"})
    started = time.monotonic()
    assert get(server.url, "/health").status == 200
    assert time.monotonic() - started >= HEALTH_POLL_S
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, server.url, "/generate", body)  # the first generation request: the stall
        unhealthy_after = None
        while unhealthy_after is None and not answer.done():
            asked = time.monotonic()
            if get(server.url, "/health").status == 503:
                unhealthy_after = time.monotonic() - asked
        reply = answer.result()
    assert unhealthy_after is not None and unhealthy_after >= 2.0, "503 only after the health timeout"
    assert reply.status == 200 and reply.json()["meta_info"]["completion_tokens"] >= 1
    assert time.monotonic() - started >= 6.0, "the answer waited for the stall"
    assert get(server.url, "/health").status == 200


def test_server_info_is_flat_with_resolved_args(sim: SimServer) -> None:
    info = get(sim.url, "/server_info").json()
    assert info["reasoning_parser"] == "kimi_k2" and info["tool_call_parser"] == "kimi_k2"
    assert info["version"] == PINNED_SGLANG_VERSION == "0.5.23"
    assert info["port"] == sim.port and info["tp_size"] == 1 and info["dp_size"] == 1
    assert info["enable_metrics"] is True and info["incremental_streaming_output"] is False
    assert "sim-server" in info["launch_command"] and isinstance(info["startup_time"], float)
    assert all(not isinstance(value, dict) for value in info.values()), "flat: no nested server_args"
    assert get(sim.url, "/get_server_info").json() == info


def test_server_info_shows_sglang_flags_as_given(fleet: dict[str, SimServer]) -> None:
    server = fleet["incremental"]
    info = get(server.url, "/server_info").json()
    assert (info["tp_size"], info["dp_size"], info["mem_fraction_static"]) == (8, 2, 0.85)
    assert info["trust_remote_code"] is True and info["served_model_name"] == "kimi-k2.5"
    assert info["incremental_streaming_output"] is True and info["reasoning_parser"] == "kimi_k2", "auto resolved"
    assert info["log_level"] == "warning" and info["watchdog_timeout"] == 600
    assert get(server.url, "/v1/models").json()["data"][0]["id"] == "kimi-k2.5"
    assert get(server.url, "/metrics").status == 404, "no --enable-metrics"


def test_server_info_reports_each_ranks_running_limit_as_sglang_resolves_it(
    sims_factory: Callable[..., list[SimServer]],
) -> None:
    # KVCacheConfigurator.resolve_max_num_reqs: --max-running-requests split over attention-DP ranks, never more
    # than half a rank's token pool; unset, 512 per context the pool holds, clamped to 2048..4096.
    two_ranks, small_pool, unset = sims_factory(
        ("--dp-size", "2", "--max-running-requests", "64", "--sim-kv-capacity", "100000"),
        ("--max-running-requests", "64", "--sim-kv-capacity", "100"),
        ("--sim-kv-capacity", "20480", "--context-length", "4096"),
    )

    def limits(server: SimServer) -> tuple[object, list[int], list[int]]:
        info = get(server.url, "/server_info").json()
        states = info["internal_states"]
        return (
            info["max_running_requests"],
            [s["effective_max_running_requests_per_dp"] for s in states],
            [s["memory_usage"]["token_capacity"] for s in states],
        )

    assert limits(two_ranks) == (64, [64, 64], [100000, 100000]), "each DP rank its own scheduler"
    assert limits(small_pool) == (64, [50], [100]), "half the token pool"
    assert limits(unset) == (None, [2560], [20480]), "512 for each of the pool's 5 contexts"


def test_model_info(sim: SimServer, standin_tokenizer: object) -> None:
    info = get(sim.url, "/model_info").json()
    assert info["model_path"] == str(standin_tokenizer) and info["is_generation"] is True
    assert info["reasoning_parser"] == "kimi_k2" and info["architectures"] == ["DeepseekV3ForCausalLM"]
    assert get(sim.url, "/get_model_info").json() == info


def test_metrics_use_sglang_names(sim: SimServer) -> None:
    generate(sim.url, {"input_ids": chat_prompt("metrics"), "sampling_params": {"max_new_tokens": 16}})
    reply = get(sim.url, "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.body.decode()
    for name in (
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:token_usage",
        "sglang:cache_hit_rate", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
        "sglang:num_requests_total", "sglang:time_to_first_token_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
    ):  # fmt: skip
        assert re.search(rf'^{re.escape(name)}{{.*model_name="[^"]+".*}} \S+$', text, re.M), name
    generated = float(re.search(r"^sglang:generation_tokens_total\{.*\} (\S+)$", text, re.M).group(1))
    assert generated >= 16


def test_loading_answers_503_with_an_empty_body(sim_factory: Callable[..., SimServer]) -> None:
    # The port refuses connections for the first half of the load (tests/sim/test_fidelity.py), then warms up.
    server = sim_factory("--sim-load-seconds", "8", wait_ready=False)
    wait_until(
        lambda: health_status(server.url, timeout_s=1) is not None, timeout=60, describe="an answer", interval=0.05
    )
    reply = get(server.url, "/health_generate")
    assert (reply.status, reply.body) == (503, b"")
    assert get(server.url, "/health").status == 503
    assert post(server.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}).status == 503
    assert get(server.url, "/server_info").status == 200, "args are known while loading"


def test_sigterm_stops_the_server_cleanly(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory()
    os.kill(server.pid, signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert health_status(server.url, timeout_s=1) is None


def test_crash_after_requests_exits_after_answering_and_restarts_on_the_same_port(
    sim_factory: Callable[..., SimServer],
) -> None:
    server = sim_factory("--sim-crash-after-requests", "2", *("--sim-mean-answer-tokens", "30"))
    body = {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 64, "temperature": 0}}  # greedy
    first = generate(server.url, body)
    second = generate(server.url, body)
    assert second["output_ids"] == first["output_ids"], "the second request is answered in full"
    assert server.wait_exit(10) == 1
    assert "crashing after 2 generation requests" in server.log_text()
    port = server.port
    server.restart()
    assert server.port == port and server.running
    assert generate(server.url, body)["output_ids"] == first["output_ids"]


def test_missing_model_path_exits_1(sim_factory: Callable[..., SimServer], tmp_path: Path) -> None:
    with pytest.raises(SimStartError, match=r"exited with 1[\s\S]*tokenizer\.json"):
        sim_factory("--model-path", str(tmp_path / "no-such-model"))


def test_missing_model_path_can_fall_back_to_the_standin(fleet: dict[str, SimServer]) -> None:
    server = fleet["fallback"]
    assert get(server.url, "/server_info").json()["model_path"] == "/nonexistent/kimi-k2.5"
    assert generate(server.url, {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 3}})
