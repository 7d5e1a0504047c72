"""SGLang's own CLI parser and argument resolution accept the launch command we build, for every preset.

Resolution (`ServerArgs.resolve_once`, as `launch_server.run_server` calls it) reads the model directory's
config.json (model type, context length) and, through the stub torch, the GPU count and free memory
(tests/contract/sglang_stubs.py: an 8 x H200 server). The model path is the Kimi-K2 stand-in for every
preset: resolution's parser handling does not depend on the model family.
"""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import parse_run
from datagen_operator.api.extra_args import MANAGED_FLAGS
from datagen_operator.engine.launch import DIST_INIT_PORT, LEADER_ADDRESS_ENV, WORKER_INDEX_ENV, server_argv
from datagen_operator.presets import get_preset, preset_names
from datagen_operator.presets.sglang_names import (
    REASONING_PARSER_NAMES,
    RESOLVED_REASONING_PARSERS,
    RESOLVED_TOOL_CALL_PARSERS,
    TOOL_CALL_PARSER_NAMES,
    resolved_reasoning_parser,
    resolved_tool_call_parser,
)
from tests.contract import sglang_side
from tests.contract.conftest import SGLang
from tests.manifests import changed, example_run

# (tensorParallel, stream) on 8 GPUs: one TP-8 server, and TP-4 x DP-2 with streaming workers.
LAYOUTS = {"tp8": (8, False), "tp4-dp2": (4, True)}


def _run_document(preset: str, tensor_parallel: int, stream: bool) -> dict[str, Any]:
    return example_run(
        **{
            "spec.model.preset": preset,
            "spec.server.gpus": 8,
            "spec.server.tensorParallel": tensor_parallel,
            "spec.generation.stream": stream,
            "spec.generation.thinking": get_preset(preset).thinking.supported,
        }
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("preset", preset_names())
def test_sglang_accepts_and_resolves_our_launch_command(sglang: SGLang, preset: str, layout: str) -> None:
    tensor_parallel, stream = LAYOUTS[layout]
    spec = parse_run(_run_document(preset, tensor_parallel, stream)).spec
    argv = server_argv(spec, model_path=str(sglang.model_dir))
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]

    resolved = sglang.call(sglang_side.resolve_launch, argv[3:])

    assert "exit" not in resolved, f"SGLang's parser refused {argv[3:]}"
    expected = get_preset(preset)
    assert resolved["reasoning_parser"] == resolved_reasoning_parser(expected.reasoning_parser)
    assert resolved["tool_call_parser"] == resolved_tool_call_parser(expected.tool_call_parser)
    assert (resolved["tp_size"], resolved["dp_size"]) == (spec.server.tp_size, spec.server.dp_size)
    assert resolved["incremental_streaming_output"] is stream


# (nodes, attentionDataParallel) of 8-GPU pods: a two-node group, and attention DP on one and on two nodes.
GROUPS = {"2-nodes": (2, None), "attn-dp-8": (1, 8), "2-nodes-attn-dp-16": (2, 16)}


def _as_pod(argv: list[str], rank: int) -> list[str]:
    """The command as Kubernetes runs it in pod `rank` of a group: `$(VAR)` expanded from LWS's variables."""
    env = {WORKER_INDEX_ENV: str(rank), LEADER_ADDRESS_ENV: "kimi-0.kimi.team"}
    expanded = []
    for arg in argv:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        expanded.append(arg)
    return expanded


@pytest.mark.parametrize("group", list(GROUPS))
@pytest.mark.parametrize("preset", preset_names())
def test_sglang_accepts_our_multi_node_and_attention_dp_commands(sglang: SGLang, preset: str, group: str) -> None:
    nodes, attention_dp = GROUPS[group]
    document = changed(_run_document(preset, 8 * nodes, stream=False), {"spec.server.nodes": nodes})
    if attention_dp is not None:
        document = changed(document, {"spec.server.attentionDataParallel": attention_dp})
    spec = parse_run(document).spec
    argv = server_argv(spec, model_path=str(sglang.model_dir))

    for rank in range(nodes):
        resolved = sglang.call(sglang_side.resolve_launch, _as_pod(argv, rank)[3:])
        assert "exit" not in resolved, f"SGLang's parser refused {argv[3:]} on rank {rank}"
        assert (resolved["tp_size"], resolved["dp_size"]) == (8 * nodes, 1)
        assert (resolved["nnodes"], resolved["node_rank"]) == (nodes, rank)
        assert resolved["dist_init_addr"] == (f"kimi-0.kimi.team:{DIST_INIT_PORT}" if nodes > 1 else None)
        assert resolved["attn_dp_size"] == (attention_dp or 1)
        # The deprecated switch, as SGLang derives it for code that still reads it.
        assert resolved["enable_dp_attention"] is (attention_dp is not None)


def test_managed_flags_cover_every_spelling_sglang_accepts(sglang: SGLang) -> None:
    """extraArgs may not carry a flag the spec manages, under any of SGLang's names for it."""
    flags = sglang.call(sglang_side.option_strings)
    managed = ("model_path", "tp_size", "dp_size", "nnodes", "node_rank", "dist_init_addr", "attn_dp_size",
               "enable_dp_attention", "mem_fraction_static", "reasoning_parser", "tool_call_parser", "host", "port",
               "served_model_name", "trust_remote_code", "enable_metrics", "incremental_streaming_output",
               "log_level", "tokenizer_path")  # fmt: skip
    missing = {dest: sorted(set(flags[dest]) - MANAGED_FLAGS) for dest in managed}
    assert {dest: names for dest, names in missing.items() if names} == {}


def test_sglang_refuses_a_parser_name_it_does_not_know(sglang: SGLang) -> None:
    # The check above can fail: an unknown name is an argparse error (exit 2), not a resolved value.
    argv = ["--model-path", str(sglang.model_dir), "--reasoning-parser", "kimi-k2"]
    assert sglang.call(sglang_side.resolve_launch, argv) == {"exit": 2}


def _resolutions(sglang: SGLang, flag: str, names: tuple[str, ...], key: str) -> dict[str, str]:
    """Each name as SGLang's resolution leaves it, keeping only the names it rewrites."""
    rewritten = {}
    for name in names:
        resolved = sglang.call(sglang_side.resolve_launch, ["--model-path", str(sglang.model_dir), flag, name])
        assert "exit" not in resolved, f"SGLang refused {flag} {name}"
        if resolved[key] != name:
            rewritten[name] = resolved[key]
    return rewritten


def test_our_resolved_tool_call_parser_table_is_sglangs(sglang: SGLang) -> None:
    rewritten = _resolutions(sglang, "--tool-call-parser", TOOL_CALL_PARSER_NAMES, "tool_call_parser")
    assert rewritten == RESOLVED_TOOL_CALL_PARSERS


def test_our_resolved_reasoning_parser_table_is_sglangs(sglang: SGLang) -> None:
    rewritten = _resolutions(sglang, "--reasoning-parser", REASONING_PARSER_NAMES, "reasoning_parser")
    assert rewritten == RESOLVED_REASONING_PARSERS
