"""`datagen sim-server` arguments: SGLang's own flags (as `sglang.launch_server` spells them) plus `--sim-*`."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from datagen_operator.engine.sim import resolution
from datagen_operator.engine.tool_calls import TOOL_CALL_PARSERS
from datagen_operator.presets.sglang_names import REASONING_PARSER_NAMES, TOOL_CALL_PARSER_NAMES
from datagen_operator.tokenizer.families import FAMILIES

Misconfig = Literal["never-close-think", "kimi-tags", "ignore-thinking"]
SpeedMode = Literal["wire", "gpu"]


def kept_stop_id(tool_call_parser: str | None) -> int | None:
    """The stop id SGLang's detokenizer keeps for the launch's tool-call parser (gpt-oss's `<|call|>`)."""
    syntax = TOOL_CALL_PARSERS.get(tool_call_parser or "")
    return syntax.kept_stop_id if syntax is not None else None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What the simulated model writes (see `model.py`)."""

    seed: int = 0
    mean_answer_tokens: float = 400.0
    answer_tokens_per_prompt_token: float = 0.0
    """When above 0, an answer's mean length is this many tokens per prompt token (in place of
    mean_answer_tokens): long prompts get long answers, so shards of long prompts finish late."""
    mean_reasoning_tokens: float = 800.0
    length_sigma: float = 0.6
    tool_call_rate: float = 0.5
    unprompted_thinking: bool = True
    misconfig: Misconfig | None = None
    kept_stop_id: int | None = None
    """A stop token SGLang's detokenizer keeps in `text` (gpt-oss's <|call|> under --tool-call-parser gpt-oss)."""
    default_sampling_seed: int | None = None
    """The seed of an unseeded request: 42 under --enable-deterministic-inference, as SGLang's sampling batch."""


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Injected failures (see `faults.py`); rates are per generation request, in [0, 1]."""

    seed: int = 0
    error_5xx_rate: float = 0.0
    error_5xx_status: int = 500
    reset_rate: float = 0.0
    stream_error_rate: float = 0.0
    abort_rate: float = 0.0
    nan_rate: float = 0.0
    """SGLang's NaN guard: a sampled id outside the vocabulary, replaced by a stop id (model.nan_guarded)."""
    hang_s: float = 0.0
    hang_rate: float = 1.0
    crash_after_requests: int = 0
    prompt_suffix_leak: int = 0
    stall_s: float = 0.0
    """The scheduler makes no progress this long once `stall_after_requests` requests came: answers wait,
    health calls see no output (SGLang answers 503 after its health timeout) while /generate still accepts."""
    stall_after_requests: int = 1
    retraction_rate: float = 0.0
    """Requests SGLang retracted once under KV pressure (`Req.reset_for_retract`): meta_info.num_retractions 1."""


@dataclass(frozen=True, slots=True)
class SpeedConfig:
    mode: SpeedMode = "wire"
    tokens_per_s: float = 60.0
    ttft_s: float = 0.2
    load_seconds: float = 0.0
    expected_in_flight: int = 0
    """/generate requests the clients should keep in flight (sglang_sim:underfilled_seconds; 0: not measured)."""


@dataclass(frozen=True, slots=True)
class SimSettings:
    server_args: dict[str, Any]
    """SGLang's resolved server args as /server_info shows them (flat)."""
    model: ModelConfig
    faults: FaultConfig
    speed: SpeedConfig
    host: str
    port: int
    tokenizer_dir: Path | None
    """None: use the cached stand-in tokenizer of `family` (default Kimi-K2)."""
    family: str | None
    """The model family (tokenizer/families.py); None: the stand-in's own, or detected from the vocabulary."""
    port_file: Path | None
    fallback_standin: bool


def _rate(value: str) -> float:
    rate = float(value)
    if not 0.0 <= rate <= 1.0:
        raise argparse.ArgumentTypeError(f"a rate must be in [0, 1], got {value}")
    return rate


def _non_negative_float(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datagen sim-server",
        description="Simulate SGLang's HTTP server on CPU (the model family's token format, no model weights).",
        allow_abbrev=False,
    )
    _add_sglang_flags(parser.add_argument_group("SGLang flags (as sglang.launch_server spells them)"))
    sim = parser.add_argument_group("simulator-only flags")
    _add_sim_model_flags(sim)
    _add_sim_fault_flags(sim)
    return parser


def _add_sglang_flags(sg: argparse._ArgumentGroup) -> None:
    sg.add_argument("--model-path", "--model", dest="model_path", help="tokenizer dir (default: the stand-in)")
    sg.add_argument("--tokenizer-path", help="tokenizer dir when it differs from --model-path")
    sg.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    sg.add_argument("--dp-size", "--dp", "--data-parallel-size", dest="dp_size", type=int, default=1)
    sg.add_argument("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size", type=int, default=1)
    sg.add_argument("--enable-dp-attention", action="store_true", help="deprecated: --dp-size N is --attn-dp-size N")
    sg.add_argument("--mem-fraction-static", type=float)
    sg.add_argument(
        "--max-running-requests",
        "--sim-batch-capacity",  # the simulator's older name for it
        dest="max_running_requests",
        type=_positive_int,
        help="gpu speed: requests running at once, as SGLang resolves it per DP rank (default: its estimate from the "
        "token pool); more wait",
    )
    sg.add_argument("--max-queued-requests", type=int, help="gpu speed: a request beyond this many waiting is shed")
    sg.add_argument("--trust-remote-code", action="store_true")
    sg.add_argument("--reasoning-parser", choices=["auto", *REASONING_PARSER_NAMES])
    sg.add_argument("--tool-call-parser", choices=["auto", *TOOL_CALL_PARSER_NAMES])
    sg.add_argument("--served-model-name")
    sg.add_argument("--chat-template", help="a chat template file replacing the tokenizer's")
    sg.add_argument("--skip-tokenizer-init", action="store_true")
    sg.add_argument("--host", default="127.0.0.1")
    sg.add_argument("--port", type=int, default=30000, help="0 picks a free port (simulator only)")
    sg.add_argument("--enable-metrics", action="store_true")
    sg.add_argument("--incremental-streaming-output", action="store_true")
    sg.add_argument("--stream-interval", type=int, default=1)
    sg.add_argument("--log-level", default="info")
    sg.add_argument("--watchdog-timeout", type=float, default=300.0)
    sg.add_argument("--context-length", type=int)
    sg.add_argument("--random-seed", type=int)
    sg.add_argument("--disable-radix-cache", action="store_true")
    # SGLang resolves 1 for the stand-in models' default attention backend (fa3 on Hopper).
    sg.add_argument("--page-size", type=int, default=1, help="tokens per KV page: the radix cache's granularity")
    sg.add_argument("--enable-deterministic-inference", action="store_true", help="unseeded requests use seed 42")
    sg.add_argument("--nnodes", type=int, default=1)
    sg.add_argument("--node-rank", type=int, default=0)
    sg.add_argument("--dist-init-addr")
    sg.add_argument("--revision")
    sg.add_argument("--dtype", choices=resolution.DTYPE_CHOICES, default="auto")
    sg.add_argument("--quantization", choices=resolution.QUANTIZATION_CHOICES)
    sg.add_argument("--kv-cache-dtype", choices=resolution.KV_CACHE_DTYPE_CHOICES, default="auto")
    sg.add_argument("--speculative-algorithm", help="EAGLE/EAGLE3/NEXTN reserve their draft tokens in the context")
    sg.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    sg.add_argument("--speculative-num-steps", type=int)
    sg.add_argument("--speculative-eagle-topk", type=int)
    sg.add_argument("--speculative-num-draft-tokens", type=int)


def _add_sim_model_flags(sim: argparse._ArgumentGroup) -> None:
    """The simulated model: its speed, answer lengths, tool calls, family and a broken template to catch."""
    sim.add_argument("--sim-seed", type=int, default=0, help="model and fault seed (default 0)")
    sim.add_argument("--sim-speed", choices=get_args(SpeedMode), default="wire", help="wire: no sleeps")
    sim.add_argument("--sim-tokens-per-s", type=_positive_float, default=60.0, help="per request (gpu speed)")
    sim.add_argument("--sim-ttft-s", type=_non_negative_float, default=0.2, help="time to first token (gpu)")
    sim.add_argument("--sim-load-seconds", type=_non_negative_float, default=0.0, help="/health 503 this long")
    sim.add_argument(
        "--sim-mean-answer-tokens", type=_positive_float, default=400.0, help="mean answer length (lognormal)"
    )
    sim.add_argument(
        "--sim-answer-tokens-per-prompt-token",
        type=_non_negative_float,
        default=0.0,
        help="mean answer length per prompt token, in place of --sim-mean-answer-tokens (0: off)",
    )
    sim.add_argument(
        "--sim-expected-in-flight",
        type=_non_negative_int,
        default=0,
        help="report sglang_sim:underfilled_seconds, time with fewer /generate requests in flight than this (0: off)",
    )
    sim.add_argument(
        "--sim-mean-reasoning-tokens", type=_positive_float, default=800.0, help="mean reasoning length (lognormal)"
    )
    sim.add_argument("--sim-length-sigma", type=_non_negative_float, default=0.6, help="lognormal sigma; 0 fixes")
    sim.add_argument("--sim-tool-call-rate", type=_rate, default=0.5, help="when the prompt declares tools")
    sim.add_argument(
        "--sim-no-unprompted-thinking",
        action="store_true",
        help="a prompt whose tail neither opens reasoning nor turns it off gets none (default: a thinking model "
        "opens it itself, as Kimi-K2-Thinking does)",
    )
    sim.add_argument(
        "--sim-misconfig",
        choices=get_args(Misconfig),
        help="a broken model or template, to see the checks catch it: never-close-think (reasoning with no "
        "closer), kimi-tags (the old ◁think▷ markers as text), ignore-thinking (never reasons); default: none",
    )
    sim.add_argument(
        "--sim-family",
        choices=sorted(FAMILIES),
        help="the model family the tokenizer belongs to (default: a stand-in's own, else detected from its tokens)",
    )


def _add_sim_fault_flags(sim: argparse._ArgumentGroup) -> None:
    """Faults to meet (errors, resets, hangs, a stall, a crash, retractions, a small KV pool) and the process's own."""
    sim.add_argument("--sim-fault-5xx-rate", type=_rate, default=0.0, help="share of requests answered 5xx")
    sim.add_argument("--sim-fault-5xx-status", type=int, default=500, help="the status of those answers")
    sim.add_argument("--sim-fault-reset-rate", type=_rate, default=0.0, help="connection reset mid-response")
    sim.add_argument("--sim-fault-stream-error-rate", type=_rate, default=0.0, help="error event mid-stream")
    sim.add_argument("--sim-fault-abort-rate", type=_rate, default=0.0, help="finish_reason abort, partial output")
    sim.add_argument(
        "--sim-fault-nan-rate",
        type=_rate,
        default=0.0,
        help='NaN logits mid-answer: a stop id written in place, finish_reason {"type": "stop", "matched": "NaN happened"}',
    )
    sim.add_argument(
        "--sim-kv-capacity",
        type=_non_negative_int,
        default=0,
        help="max_total_num_tokens of every rank (default: measured, several contexts): a pool smaller than "
        "prompt + max_new_tokens caps the answers as SGLang's scheduler does",
    )
    sim.add_argument(
        "--sim-retraction-rate",
        type=_rate,
        default=0.0,
        help="share of requests retracted once (KV memory short) and re-prefilled: meta_info.num_retractions 1",
    )
    sim.add_argument("--sim-fault-hang-s", type=_non_negative_float, default=0.0, help="delay before answering")
    sim.add_argument(
        "--sim-fault-stall-s", type=_non_negative_float, default=0.0, help="the scheduler stalls this long (health 503)"
    )
    sim.add_argument(
        "--sim-fault-stall-after-requests", type=_non_negative_int, default=1, help="the stall starts at this request"
    )
    sim.add_argument("--sim-fault-hang-rate", type=_rate, default=1.0, help="share of requests that hang")
    sim.add_argument(
        "--sim-crash-after-requests", type=_non_negative_int, default=0, help="exit 1 after N generation requests"
    )
    sim.add_argument(
        "--sim-prompt-suffix-leak",
        type=_non_negative_int,
        default=0,
        help="upstream bug: output_ids start with the last N prompt tokens (not counted in completion_tokens)",
    )
    sim.add_argument("--sim-port-file", type=Path, help="write the bound port here once listening")
    sim.add_argument(
        "--sim-fallback-standin", action="store_true", help="use the stand-in tokenizer if --model-path is missing"
    )


def _resolve_parser(name: str | None) -> str | None:
    # `auto` guesses from the vocabulary; the simulator only serves Kimi-K2-format models.
    return "kimi_k2" if name == "auto" else name


def parse_settings(argv: list[str]) -> SimSettings:
    """Parse the command line; argparse exits 2 on a bad flag or an unknown parser name, and a launch SGLang's
    resolution refuses raises `resolution.LaunchError`. Fields that depend on the model's config are resolved
    once it is loaded (`resolution.model_resolved`)."""
    args = build_parser().parse_args(argv)
    tokenizer_dir = args.tokenizer_path or args.model_path
    return SimSettings(
        server_args=_server_args(args, argv),
        model=_model_config(args),
        faults=_fault_config(args),
        speed=SpeedConfig(
            mode=args.sim_speed,
            tokens_per_s=args.sim_tokens_per_s,
            ttft_s=args.sim_ttft_s,
            load_seconds=args.sim_load_seconds,
            expected_in_flight=args.sim_expected_in_flight,
        ),
        host=args.host,
        port=args.port,
        tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
        family=args.sim_family,
        port_file=args.sim_port_file,
        fallback_standin=args.sim_fallback_standin,
    )


def _server_args(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """SGLang's server args as /server_info shows them, resolved from the launch's flags as SGLang does."""
    dp_size, attn_dp_size = resolution.data_parallel(
        args.tp_size, args.dp_size, args.attn_dp_size, args.enable_dp_attention
    )
    model_path = args.model_path
    served_name = args.served_model_name or model_path or "kimi-k2-standin"
    server_args: dict[str, Any] = {
        "model_path": model_path,
        "tokenizer_path": args.tokenizer_path or model_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": args.skip_tokenizer_init,
        "trust_remote_code": args.trust_remote_code,
        "served_model_name": served_name,
        "chat_template": args.chat_template,
        "context_length": args.context_length,
        "host": args.host,
        "port": args.port,
        "tp_size": args.tp_size,
        "dp_size": dp_size,
        "attn_dp_size": attn_dp_size,
        # Deprecated; reported for clients that still read it: whether attention DP runs (`resolved_dict`).
        "enable_dp_attention": attn_dp_size > 1,
        "mem_fraction_static": args.mem_fraction_static,
        "max_running_requests": args.max_running_requests,
        "max_queued_requests": args.max_queued_requests,
        "reasoning_parser": _resolve_parser(args.reasoning_parser),
        "tool_call_parser": _resolve_parser(args.tool_call_parser),
        "enable_metrics": args.enable_metrics,
        "incremental_streaming_output": args.incremental_streaming_output,
        "stream_interval": args.stream_interval,
        "log_level": args.log_level,
        "watchdog_timeout": args.watchdog_timeout,
        "random_seed": args.random_seed,
        "disable_radix_cache": args.disable_radix_cache,
        "page_size": args.page_size,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "dist_init_addr": args.dist_init_addr,
        **resolution.DATA_ARG_DEFAULTS,
        "revision": args.revision,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "enable_deterministic_inference": args.enable_deterministic_inference,
        "sampling_backend": resolution.sampling_backend(args.enable_deterministic_inference),
        "speculative_algorithm": resolution.speculative_algorithm(args.speculative_algorithm),
        "speculative_draft_model_path": args.speculative_draft_model_path,
        "speculative_num_steps": args.speculative_num_steps,
        "speculative_eagle_topk": args.speculative_eagle_topk,
        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
        "launch_command": shlex.join([sys.executable, "-m", "datagen_operator.cli", "sim-server", *argv]),
        "sim_speed": args.sim_speed,
        "sim_seed": args.sim_seed,
        "sim_misconfig": args.sim_misconfig,
        "sim_prompt_suffix_leak": args.sim_prompt_suffix_leak,
        "sim_kv_capacity": args.sim_kv_capacity,
    }
    return server_args


def _model_config(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        seed=args.sim_seed,
        mean_answer_tokens=args.sim_mean_answer_tokens,
        answer_tokens_per_prompt_token=args.sim_answer_tokens_per_prompt_token,
        mean_reasoning_tokens=args.sim_mean_reasoning_tokens,
        length_sigma=args.sim_length_sigma,
        tool_call_rate=args.sim_tool_call_rate,
        unprompted_thinking=not args.sim_no_unprompted_thinking,
        misconfig=args.sim_misconfig,
        kept_stop_id=kept_stop_id(args.tool_call_parser),
        default_sampling_seed=42 if args.enable_deterministic_inference else None,
    )


def _fault_config(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(
        seed=args.sim_seed,
        error_5xx_rate=args.sim_fault_5xx_rate,
        error_5xx_status=args.sim_fault_5xx_status,
        reset_rate=args.sim_fault_reset_rate,
        stream_error_rate=args.sim_fault_stream_error_rate,
        abort_rate=args.sim_fault_abort_rate,
        nan_rate=args.sim_fault_nan_rate,
        hang_s=args.sim_fault_hang_s,
        hang_rate=args.sim_fault_hang_rate,
        crash_after_requests=args.sim_crash_after_requests,
        prompt_suffix_leak=args.sim_prompt_suffix_leak,
        stall_s=args.sim_fault_stall_s,
        stall_after_requests=args.sim_fault_stall_after_requests,
        retraction_rate=args.sim_retraction_rate,
    )
