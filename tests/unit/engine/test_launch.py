"""The SGLang launch command is a pure function of the spec."""

from __future__ import annotations

import pytest

from datagen_operator.api import SpecError, parse_run
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.engine.launch import server_argv
from tests.manifests import example_run


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_kimi_k25_launch_command() -> None:
    argv = server_argv(parse_run(example_run()).spec)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert flag_value(argv, "--model-path") == "/models/kimi-k2.5-int4"
    assert flag_value(argv, "--reasoning-parser") == "kimi_k2"
    assert flag_value(argv, "--tool-call-parser") == "kimi_k2"
    assert flag_value(argv, "--tp-size") == "8"
    assert flag_value(argv, "--mem-fraction-static") == "0.85"
    assert "--trust-remote-code" in argv and "--enable-metrics" in argv
    assert "--dp-size" not in argv
    assert "--incremental-streaming-output" not in argv


def test_the_server_loads_the_tokenizer_the_workers_render_with() -> None:
    # Its stop ids and chat template are then the run's (checks/record_checks.py reads the same).
    assert "--tokenizer-path" not in server_argv(parse_run(example_run()).spec)
    run = parse_run(example_run(**{"spec.model.tokenizerPath": "/models/kimi-k2.5-int4/tokenizer"}))
    assert flag_value(server_argv(run.spec), "--tokenizer-path") == "/models/kimi-k2.5-int4/tokenizer"


def test_streaming_workers_get_incremental_output() -> None:
    argv = server_argv(parse_run(example_run(**{"spec.generation.stream": True})).spec)
    assert "--incremental-streaming-output" in argv


def test_dp_inside_a_pod() -> None:
    argv = server_argv(parse_run(example_run(**{"spec.server.tensorParallel": 2})).spec)
    assert (flag_value(argv, "--tp-size"), flag_value(argv, "--dp-size")) == ("2", "4")


def test_non_thinking_preset_has_no_reasoning_parser() -> None:
    document = example_run(**{"spec.model.preset": "kimi-k2-instruct", "spec.generation.thinking": False})
    argv = server_argv(parse_run(document).spec)
    assert "--reasoning-parser" not in argv
    assert flag_value(argv, "--tool-call-parser") == "kimi_k2"


def test_extra_args_pass_through() -> None:
    argv = server_argv(parse_run(example_run(**{"spec.server.extraArgs": ["--watchdog-timeout", "600"]})).spec)
    assert argv[-2:] == ["--watchdog-timeout", "600"]


@pytest.mark.parametrize("extra", [["--reasoning-parser", "kimi"], ["--tp=4"], ["--port", "1"], ["--model", "/x"]])
def test_extra_args_cannot_override_managed_flags(extra: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        parse_run(example_run(**{"spec.server.extraArgs": extra}))
    (error,) = caught.value.errors
    assert error.field == "spec.server.extraArgs[0]"
    assert "managed by the operator" in error.message


def test_host_port_and_model_path_overrides() -> None:
    argv = server_argv(parse_run(example_run()).spec, host="127.0.0.1", port=31000, model_path="/tmp/m")
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "31000"
    assert flag_value(argv, "--model-path") == "/tmp/m"


def test_a_server_side_chat_template_is_refused_naming_the_fix() -> None:
    with pytest.raises(SpecError) as caught:
        parse_run(example_run(**{"spec.server.extraArgs": ["--chat-template", "/t.jinja"]}))
    (error,) = caught.value.errors
    assert error.field == "spec.server.extraArgs[0]"
    assert "the workers render prompts with the template in the model directory" in error.message


def test_a_sampling_seed_turns_on_deterministic_inference() -> None:
    """SGLang ignores sampling_seed without --enable-deterministic-inference (SGLang 0.5.23
    sglang/srt/sampling/sampling_batch_info.py)."""
    assert "--enable-deterministic-inference" not in server_argv(parse_run(example_run()).spec)
    seeded = parse_run(example_run(**{"spec.generation.sampling.sampling_seed": 7})).spec
    assert server_argv(seeded).count("--enable-deterministic-inference") == 1
    # The flag itself is refused in extraArgs (tests/unit/api/test_extra_args.py): the seed is its only switch.


def two_node_spec(**server: object) -> DataGenRunSpec:
    changes = {f"spec.server.{key}": value for key, value in {"nodes": 2, "tensorParallel": 16, **server}.items()}
    return parse_run(example_run(**changes)).spec


def test_a_two_node_group_runs_one_command_fed_by_the_lws_environment() -> None:
    argv = server_argv(two_node_spec())
    assert flag_value(argv, "--tp-size") == "16"
    assert flag_value(argv, "--nnodes") == "2"
    # Left for Kubernetes to expand from the variables LeaderWorkerSet injects into each pod.
    assert flag_value(argv, "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert flag_value(argv, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    assert "--dp-size" not in argv


def test_one_node_has_no_multi_node_flags() -> None:
    argv = server_argv(parse_run(example_run()).spec)
    assert not {"--nnodes", "--node-rank", "--dist-init-addr", "--attn-dp-size"} & set(argv)


def test_attention_data_parallel_is_attn_dp_size() -> None:
    argv = server_argv(two_node_spec(attentionDataParallel=16))
    assert flag_value(argv, "--attn-dp-size") == "16"
    assert "--enable-dp-attention" not in argv  # SGLang 0.5.23's deprecated spelling


@pytest.mark.parametrize(
    "flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--attn-dp-size", "--enable-dp-attention"]
)
def test_extra_args_cannot_set_the_group_or_attention_dp(flag: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_run(example_run(**{"spec.server.extraArgs": [flag, "2"]}))
    (error,) = caught.value.errors
    assert "managed by the operator" in error.message
