"""The launch as SGLang resolves it, through a running simulator: attention data parallelism (the operator's
`--attn-dp-size`), data-parallel replicas' sizes in /server_info, the numeric formats and every fingerprinted
key, and speculative decoding's reserved tokens in the length check. (Each is held to SGLang's own code in
tests/contract/test_sim_launch.py.)
"""

from __future__ import annotations

from collections.abc import Callable

from datagen_operator.api import parse_run
from datagen_operator.engine.launch import LEADER_ADDRESS_ENV, WORKER_INDEX_ENV, server_argv
from datagen_operator.engine.sim.config import parse_settings
from datagen_operator.output.fingerprint import DATA_SERVER_ARGS
from tests.harness.sim import SimServer
from tests.manifests import example_run
from tests.sim.conftest import SHORT
from tests.sim.http import get, post
from tests.sim.prompts import chat_prompt


def _launch_flags(server: dict[str, object]) -> list[str]:
    """The operator's launch command for an example run with these server fields, without the program, as the
    leader pod runs it (Kubernetes expands the LeaderWorkerSet variables)."""
    document = example_run(**{f"spec.server.{key}": value for key, value in server.items()})
    argv = server_argv(parse_run(document).spec, model_path="/models/kimi")[3:]
    return [arg.replace(f"$({WORKER_INDEX_ENV})", "0").replace(f"$({LEADER_ADDRESS_ENV})", "leader") for arg in argv]


def test_the_operators_attention_dp_command_is_accepted() -> None:
    args = parse_settings(_launch_flags({"gpus": 8, "tensorParallel": 8, "attentionDataParallel": 8})).server_args
    assert (args["tp_size"], args["dp_size"], args["attn_dp_size"], args["enable_dp_attention"]) == (8, 1, 8, True)
    over_nodes = _launch_flags({"gpus": 8, "nodes": 2, "tensorParallel": 16, "attentionDataParallel": 16})
    assert parse_settings(over_nodes).server_args["attn_dp_size"] == 16


def test_the_deprecated_dp_attention_switch_moves_dp_size_to_attn_dp_size() -> None:
    args = parse_settings(["--tp-size", "8", "--dp-size", "4", "--enable-dp-attention"]).server_args
    assert (args["dp_size"], args["attn_dp_size"], args["enable_dp_attention"]) == (1, 4, True)


def test_a_layout_sglang_refuses_fails_the_launch() -> None:
    server = SimServer(["--tp-size", "4", "--dp-size", "2", "--attn-dp-size", "2"]).spawn()
    try:
        assert server.wait_exit(30) == 1
    finally:
        server.stop()
    assert "data-parallel replicas combined with attention data parallelism are not supported" in server.log_text()


def test_attention_dp_ranks_share_one_measured_capacity(sim_factory: Callable[..., SimServer]) -> None:
    info = get(sim_factory("--tp-size", "8", "--attn-dp-size", "8", *SHORT).url, "/server_info").json()
    assert (info["dp_size"], info["attn_dp_size"], info["enable_dp_attention"]) == (1, 8, True)
    capacities = {state["memory_usage"]["token_capacity"] for state in info["internal_states"]}
    assert len(info["internal_states"]) == 8 and capacities == {info["max_total_num_tokens"]}


def test_a_data_parallel_server_reports_one_replicas_sizes(fleet: dict[str, SimServer]) -> None:
    """Each replica measures its own KV pool; /server_info's top level is the replica that finished loading
    last, its internal_states one entry per replica."""
    info = get(fleet["incremental"].url, "/server_info").json()  # --tp 8 --dp-size 2
    capacities = [state["memory_usage"]["token_capacity"] for state in info["internal_states"]]
    assert len(capacities) == 2 and capacities[0] != capacities[1]
    assert info["max_total_num_tokens"] in capacities
    assert info["max_req_input_len"] == min(262_144 - 1, info["max_total_num_tokens"] - 1) - 5


def test_server_info_reports_every_fingerprinted_key(sim: SimServer) -> None:
    info = get(sim.url, "/server_info").json()
    assert set(DATA_SERVER_ARGS) <= set(info)
    formats = {key: info[key] for key in ("dtype", "quantization", "kv_cache_dtype", "revision")}
    assert formats == {"dtype": "auto", "quantization": None, "kv_cache_dtype": "auto", "revision": None}
    assert (info["attn_dp_size"], info["enable_dp_attention"], info["sampling_backend"]) == (1, False, "flashinfer")


def test_format_flags_are_reported_as_given(sim_factory: Callable[..., SimServer]) -> None:
    flags = ["--dtype", "bfloat16", "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3", "--revision", "abc"]
    info = get(sim_factory(*flags, *SHORT).url, "/server_info").json()
    formats = {key: info[key] for key in ("dtype", "quantization", "kv_cache_dtype", "revision")}
    assert formats == {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "revision": "abc"}


def test_eagle_draft_tokens_count_against_the_context(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--context-length", "4096", "--speculative-algorithm", "NEXTN", *SHORT)
    info = get(server.url, "/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        3, 1, 4,
    )  # fmt: skip
    prompt = chat_prompt()
    fits = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096 - 4 - len(prompt)}}
    assert post(server.url, "/generate", fits).status == 200
    over = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096 - 3 - len(prompt)}}
    reply = post(server.url, "/generate", over)
    message = reply.json()["error"]["message"]
    assert reply.status == 400 and f"a total of 4097 tokens: {len(prompt) + 4} tokens from the input" in message
