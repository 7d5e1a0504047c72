"""More of SGLang's own code paths for the simulator's contract tests, run in the SGLang child process.

Like `sglang_side` (whose `load` has imported SGLang behind the stubs by the time these run), each function
calls SGLang's functions and methods on plain data and returns plain data. Resolution runs as on SGLang's
CUDA image, where flashinfer is installed (`override_platform(has_flashinfer=True)`, SGLang's own switch for
platform facts): the stub machine has no flashinfer, which would change the resolved `sampling_backend`.
"""

from __future__ import annotations

import argparse
import ast
import threading
import types
from pathlib import Path
from typing import Any

from tests.contract import sglang_side

# `Req`'s finish checks, bound to a stand-in request that holds only what they read.
_FINISH_METHODS = (
    "update_finish_state", "finished", "_check_vocab_boundary_finish", "_check_str_based_finish",
    "_check_token_based_finish", "_cap_finished_len_at_max_new_tokens", "tail_str", "_stop_match_tail_len",
    "_locate_str_stop_finished_len",
)  # fmt: skip


class _Tokenizer:
    """The tokenizer attributes the finish checks and `SamplingParams.normalize` read, over a real tokenizer
    (SGLang's `get_tokenizer` adds `additional_stop_token_ids`; the stand-ins have none)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.additional_stop_token_ids = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids))


def finish_state(
    *,
    model_dir: str,
    output_ids: list[int],
    sampling_params: dict[str, Any],
    eos_token_ids: list[int],
    vocab_size: int,
) -> dict[str, Any]:
    """`Req.update_finish_state` after each token of `output_ids`, as the scheduler calls it once per decoded
    token, until the request finishes: {"finish_reason": its JSON, "finished_len": the output length kept,
    "output_ids": those ids, as the finish checks left them (the NaN guard writes a stop id over a bad one)}.
    An output that never finishes is {"finish_reason": None}."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    tokenizer = _Tokenizer(sglang_side._tokenizer(model_dir, False))
    params = SamplingParams(**sampling_params)
    params.normalize(tokenizer)
    request = types.SimpleNamespace(
        rid="contract", output_ids=[], finished_reason=None, finished_len=None, to_finish=None, grammar=None,
        decoded_text="", sampling_params=params, tokenizer=tokenizer, eos_token_ids=set(eos_token_ids),
        vocab_size=vocab_size,
    )  # fmt: skip
    for method in _FINISH_METHODS:
        setattr(request, method, types.MethodType(getattr(Req, method), request))
    for token_id in output_ids:
        request.output_ids.append(token_id)
        request.update_finish_state()
        if request.finished():
            kept = request.finished_len if request.finished_len is not None else len(request.output_ids)
            return {
                "finish_reason": request.finished_reason.to_json(),
                "finished_len": kept,
                "output_ids": request.output_ids[:kept],
            }
    return {"finish_reason": None}


def launch_resolution(argv: list[str], keys: list[str]) -> dict[str, Any]:
    """`sglang serve` on `argv` as `/server_info` reports it: the `keys` of `resolved_dict()`, plus
    `num_reserved_tokens`, the tokenizer manager's `compute_num_reserved_tokens()` for this launch. A launch
    SGLang refuses is {"refused": "<exception type>: <message>"} (argparse: {"exit": code})."""
    from sglang.srt.managers import utils as manager_utils
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    server_args = sglang_side._STATE["server_args"]
    try:
        parsed = server_args.prepare_server_args(argv)
    except SystemExit as refusal:
        return {"exit": refusal.code}
    try:
        with override_platform(has_flashinfer=True):
            parsed.resolve_once()
        resolved = dict(msgspec_to_builtins(parsed.resolved_dict()))
        reserved = _num_reserved_tokens(manager_utils, resolved)
    except (AssertionError, TypeError, ValueError, NotImplementedError) as error:
        return {"refused": f"{type(error).__name__}: {error}"}
    return {**{key: resolved[key] for key in keys}, "num_reserved_tokens": reserved}


def _num_reserved_tokens(manager_utils: Any, resolved: dict[str, Any]) -> int:
    """SGLang's `compute_num_reserved_tokens`, reading this launch's speculative config where the tokenizer
    manager reads the published one (publishing it would change the process-wide args other tests use)."""
    spec = types.SimpleNamespace(
        speculative_algorithm=resolved["speculative_algorithm"],
        speculative_eagle_topk=resolved["speculative_eagle_topk"],
        speculative_num_steps=resolved["speculative_num_steps"],
        speculative_num_draft_tokens=resolved["speculative_num_draft_tokens"],
        max_speculative_num_draft_tokens=None,  # set only by adaptive speculative decoding
    )
    runtime_context = manager_utils.max_speculative_num_draft_tokens.__globals__
    saved = manager_utils.get_spec, runtime_context["get_spec"]
    manager_utils.get_spec = runtime_context["get_spec"] = lambda: spec
    try:
        return int(manager_utils.compute_num_reserved_tokens())
    finally:
        manager_utils.get_spec, runtime_context["get_spec"] = saved


def length_verdict(input_len: int, max_new_tokens: int | None, context_length: int, reserved: int) -> str | None:
    """`TokenizerManager._validate_one_request` on one request with `reserved` tokens reserved per request:
    None when admitted, else its error text."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    manager = sglang_side._tokenizer_manager(context_length, sglang_side.VOCAB_SIZE)
    manager.num_reserved_tokens = reserved
    params = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    request = GenerateReqInput(input_ids=[100] * input_len, sampling_params=params)
    request.normalize_batch_and_arguments()
    try:
        manager._validate_one_request(request, list(request.input_ids))
    except ValueError as error:
        return str(error)
    return None


def _controller_methods(*names: str) -> dict[str, Any]:
    """Methods of `DataParallelController`, compiled from the wheel's own source: its module imports the whole
    scheduler, which does not import behind the stubs. The names they use are bound from SGLang's modules."""
    import sglang
    from sglang.srt.mem_cache.hicache_storage import merge_l3_layouts
    from sglang.srt.observability.startup_time import aggregate_scheduler_startup_times

    path = Path(sglang.__file__).parent / "srt" / "managers" / "data_parallel_controller.py"
    tree = ast.parse(path.read_text())
    controller = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "DataParallelController"
    )
    methods = [node for node in controller.body if isinstance(node, ast.FunctionDef) and node.name in names]
    namespace: dict[str, Any] = {"merge_l3_layouts": merge_l3_layouts,
                                 "aggregate_scheduler_startup_times": aggregate_scheduler_startup_times}  # fmt: skip
    exec(compile(ast.Module(body=methods, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


def scheduler_max_new_tokens(input_len: int, sampling_params: dict[str, Any], context_len: int) -> int:
    """`Scheduler.init_req_max_new_tokens` (compiled from the wheel's source, as its module does not import behind
    the stubs) on one request of a server whose KV pool does not bind: `max_req_len` as `TpModelWorker` sets it
    (`context_len - 1` below the pool), the memory budget left as asked."""
    import logging

    import sglang
    from sglang.srt.sampling.sampling_params import SamplingParams

    path = Path(sglang.__file__).parent / "srt" / "managers" / "scheduler.py"
    tree = ast.parse(path.read_text())
    scheduler = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Scheduler")
    method = next(n for n in scheduler.body if isinstance(n, ast.FunctionDef) and n.name == "init_req_max_new_tokens")
    namespace: dict[str, Any] = {"logger": logging.getLogger("sglang.contract")}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    allocator = types.SimpleNamespace(max_new_tokens_for_memory=lambda _input, wanted, **_: wanted)
    scheduler_self = types.SimpleNamespace(
        max_new_tokens_limit=None, max_req_len=context_len - 1, max_total_num_tokens=1 << 40, kv_shard_widening=1,
        page_size=1, token_to_kv_pool_allocator=allocator, sliding_window_size=None, chunked_prefill_size=8192,
    )  # fmt: skip
    params = SamplingParams(**sampling_params)  # its defaults too (max_new_tokens 128 when unset)
    request = types.SimpleNamespace(origin_input_ids=[0] * input_len, sampling_params=params, rid="contract")
    namespace["init_req_max_new_tokens"](scheduler_self, request)
    return int(params.max_new_tokens)


def dp_init_info(group_infos: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """What the data-parallel controller hands the HTTP server (and so `/server_info`) when its replicas'
    TP groups report ready in the order given: `_record_scheduler_init_infos` per group, then `get_init_info`."""
    methods = _controller_methods("_record_scheduler_init_infos", "get_init_info")
    controller = types.SimpleNamespace(_scheduler_init_info_lock=threading.Lock(), _scheduler_init_infos=[])
    for infos in group_infos:
        methods["_record_scheduler_init_infos"](controller, infos)
    init_info = methods["get_init_info"](controller)
    return {key: init_info[key] for key in ("max_total_num_tokens", "max_req_input_len")}


def parser_choices(dests: list[str]) -> dict[str, list[str] | None]:
    """The choices SGLang's CLI parser allows for each destination (None: any value)."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    sglang_side._STATE["server_args"].ServerArgs.add_cli_args(parser)
    actions = {action.dest: action for action in parser._actions}
    return {dest: list(actions[dest].choices) if actions[dest].choices else None for dest in dests}


def reasoning_tags(names: list[str]) -> dict[str, list[str]]:
    """The (start, end) markers SGLang's own ReasoningParser detector for each name looks for."""
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    tags = {}
    for name in names:
        detector = ReasoningParser(model_type=name, stream_reasoning=False).detector
        tags[name] = [detector.think_start_token, detector.think_end_token]
    return tags


def abort_answer(finish_reason: dict[str, Any], is_stream: bool) -> dict[str, Any]:
    """How SGLang answers a request its scheduler finished with `finish_reason` (an abort): the tokenizer
    manager's `_handle_abort_finish_reason` on it, then what `http_server` makes of the outcome. A stream
    yields the output as a chunk: {"chunk": out}; otherwise {"status", "body"}: a ValueError (400) through
    `_create_error_response`, an HTTPException through the app's handler, which builds an `ErrorResponse`."""
    import asyncio

    import fastapi
    from sglang.srt.entrypoints.openai.protocol import ErrorResponse
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    state = types.SimpleNamespace(obj=types.SimpleNamespace(rid="r"))
    manager = types.SimpleNamespace(rid_to_state={"r": state}, _release_lora_once=lambda state: None)
    out = {"text": "", "output_ids": [], "meta_info": {"id": "r", "finish_reason": finish_reason}}
    try:
        chunk = asyncio.run(TokenizerManager._handle_abort_finish_reason(manager, out, state, is_stream))
    except fastapi.HTTPException as error:
        body = ErrorResponse(
            object="error", message=error.detail, type=str(error.status_code), code=error.status_code
        ).model_dump()
        return {"status": error.status_code, "body": body}
    except ValueError as error:
        return {"status": getattr(error, "status_code", 400), "body": {"error": {"message": str(error)}}}
    return {"chunk": chunk}


def model_eos_ids(model_dir: str) -> list[int]:
    """The eos ids SGLang's scheduler stops on for a model directory (`ModelConfig._get_hf_eos_token_id` over
    `get_config(model_path)` and `get_generation_config(model_path)`), as `ModelConfig.__init__` reads them."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_config, get_generation_config

    config = types.SimpleNamespace(
        hf_config=get_config(model_dir, trust_remote_code=False),
        hf_generation_config=get_generation_config(model_dir, trust_remote_code=False),
    )
    return sorted(ModelConfig._get_hf_eos_token_id(config))
