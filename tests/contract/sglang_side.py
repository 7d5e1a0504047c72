"""SGLang's own code, run in a child process that imports it from the unpacked pinned wheel.

Everything here executes in the process started by `conftest.sglang` (see there for why it is a separate
process): `load` imports SGLang once behind the stubs of `sglang_stubs`, and each other function runs one of
SGLang's code paths on plain data and returns plain data. Nothing of SGLang's is copied: the code paths are
SGLang's functions and methods, called as the server calls them.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

_STATE: dict[str, Any] = {}
CONTEXT_LENGTH = 262144
VOCAB_SIZE = 163840
"""The Kimi-K2 model the requests are judged against: its context length and vocabulary size."""


def load(source_root: str, model_dir: str) -> None:
    """Import SGLang's argument, request and parser modules; publish the args of one resolved launch.

    transformers is imported (and asked for torch) BEFORE the stubs exist, so it runs as it does on a
    machine without torch: configuration and tokenizers only, never models.
    """
    from transformers.utils import import_utils

    import_utils.is_torch_available()
    from tests.contract.sglang_stubs import install_stubs

    install_stubs()
    sys.path.insert(0, source_root)
    from sglang.srt import server_args

    _STATE["server_args"] = server_args
    # The request path reads the process-wide resolved args (`get_exec()`, `get_serving()`), as the tokenizer
    # manager's process has them: publish those of a plain launch on the stand-in model.
    published = server_args.prepare_server_args(["--model-path", model_dir])
    published.resolve_once()
    server_args.set_global_server_args_for_tokenizer(published)
    logging.getLogger().setLevel(logging.ERROR)


def resolve_launch(argv: list[str]) -> dict[str, Any]:
    """`sglang serve` on `argv` (flags only): SGLang's CLI parser, then its resolution, as `launch_server` runs
    them. An argparse refusal comes back as {"exit": code}; otherwise the resolved values."""
    server_args = _STATE["server_args"]
    try:
        parsed = server_args.prepare_server_args(argv)
    except SystemExit as refusal:
        return {"exit": refusal.code}
    parsed.resolve_once()
    resolved = parsed.resolved_dict()
    keys = ("reasoning_parser", "tool_call_parser", "tp_size", "dp_size", "model_path", "trust_remote_code",
            "mem_fraction_static", "served_model_name", "enable_metrics", "incremental_streaming_output",
            "nnodes", "node_rank", "dist_init_addr", "attn_dp_size", "enable_dp_attention")  # fmt: skip
    return {key: resolved[key] for key in keys}


def parsed_fields(argv: list[str], keys: list[str]) -> dict[str, Any]:
    """`sglang serve` on `argv`, parsed and not yet resolved: each ServerArgs field of `keys` as the flags set it
    (an argparse refusal: {"exit": code})."""
    try:
        parsed = _STATE["server_args"].prepare_server_args(argv)
    except SystemExit as refusal:
        return {"exit": refusal.code}
    return {key: getattr(parsed, key) for key in keys}


def server_info_args(argv: list[str]) -> dict[str, Any]:
    """The server args `/server_info` reports for a launch on `argv`: `resolved_dict()` after resolution,
    as `build_server_info` reads them, made plain as the endpoint makes them."""
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    parsed = _STATE["server_args"].prepare_server_args(argv)
    parsed.resolve_once()
    return dict(msgspec_to_builtins(parsed.resolved_dict()))


def option_strings() -> dict[str, list[str]]:
    """Every flag of `sglang serve`'s parser by destination (e.g. tp_size: --tp-size, --tensor-parallel-size)."""
    import argparse

    parser = argparse.ArgumentParser(prog="sglang serve")
    _STATE["server_args"].ServerArgs.add_cli_args(parser)
    return {action.dest: list(action.option_strings) for action in parser._actions if action.option_strings}


def _tokenizer_manager(context_length: int, vocab_size: int) -> Any:
    """The parts of a TokenizerManager its request validation reads, with SGLang's own methods bound to it."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    manager = types.SimpleNamespace(
        context_len=context_length,
        num_reserved_tokens=0,  # compute_num_reserved_tokens() without speculative decoding
        allow_auto_truncate=False,
        validate_total_tokens=True,
        model_config=types.SimpleNamespace(
            vocab_size=vocab_size, context_len=context_length, joint_head_config=None, pointer_head=None
        ),
    )
    for method in ("_validate_one_request", "_validate_joint_schema_request", "_validate_token_ids_logprob",
                   "_validate_for_matryoshka_dim"):  # fmt: skip
        setattr(manager, method, types.MethodType(getattr(TokenizerManager, method), manager))
    return manager


class _CharTokenizer:
    """A tokenizer of one id per character. `SamplingParams.normalize` only measures stop strings with it (to
    size its stop buffer); text prompts are tokenized with it (the tests' simulator side uses the same)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(char) for char in text]


def sampling_verdict(params: dict[str, Any], vocab_size: int) -> str | None:
    """What the tokenizer manager does with one request's sampling_params: construct, normalize, verify.
    Returns SGLang's error text, or None when accepted."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        sampling = SamplingParams(**params)
        sampling.normalize(_CharTokenizer())
        sampling.verify(vocab_size)
    except (TypeError, ValueError) as error:
        return str(error)
    return None


def contract_verdict(body: Any) -> str | None:
    """The HTTP contract gate of `/generate` (`entrypoints/api_contract.py`): a 400 `{"error": text}`."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error

    return generate_contract_error(body)


def generate_verdict(body: dict[str, Any], context_length: int, vocab_size: int) -> dict[str, Any] | None:
    """SGLang's answer to a `/generate` body before any generation: None when admitted, else the
    {"status", "body"} of its refusal. The steps of `http_server.generate_request` and
    `TokenizerManager.generate_request` in their order: contract gate, batch normalisation, length
    validation, sampling params."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    error = contract_verdict(body)
    if error is not None:
        return {"status": 400, "body": {"error": error}}
    manager = _tokenizer_manager(context_length, vocab_size)
    try:
        request = GenerateReqInput(**body)
        request.normalize_batch_and_arguments()
        items = [request] if request.is_single else [request[index] for index in range(request.batch_size)]
        for item in items:
            # input_ids win over text (`_tokenize_one_request`); text goes through the tokenizer.
            input_ids = list(item.input_ids) if item.input_ids is not None else _CharTokenizer().encode(item.text)
            manager._validate_one_request(item, input_ids)
            refusal = sampling_verdict(dict(item.sampling_params or {}), vocab_size)
            if refusal is not None:
                raise ValueError(refusal)
    except ValueError as error:
        return {"status": 400, "body": {"error": {"message": str(error)}}}
    return None


def chat_split(
    *,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
    chat_template: str,
    chat_template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    text: str,
) -> dict[str, Any]:
    """The chat endpoint's non-streaming split of a decoded output, as `serving_chat` does it: the reasoning
    parser forced when the template or the request says the output starts inside reasoning, then the
    function-call parser over what is left (unless the answer already started)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    from sglang.srt.parser.template_detection import detect_reasoning_pattern

    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=tools or None,
        chat_template_kwargs=chat_template_kwargs,
    )  # fmt: skip
    template_forces, reasoning_config = detect_reasoning_pattern(chat_template)
    serving = types.SimpleNamespace(
        reasoning_parser=reasoning_parser,
        tool_call_parser=tool_call_parser,
        template_manager=types.SimpleNamespace(force_reasoning=template_forces, reasoning_config=reasoning_config),
        _reasoning_detector=(
            ReasoningParser(model_type=reasoning_parser, stream_reasoning=False).detector if reasoning_parser else None
        ),
    )
    reasoning, answer_started = None, False
    tools_active = bool(tool_call_parser and request.tools)
    if reasoning_parser:
        force = template_forces or OpenAIServingChat._get_reasoning_from_request(serving, request)
        parser = ReasoningParser(
            model_type=reasoning_parser, stream_reasoning=False, force_reasoning=force, request=request,
            tool_call_parser_active=tools_active,
        )  # fmt: skip
        reasoning, text = parser.parse_non_stream(text)
        answer_started = OpenAIServingChat._answer_started(parser)
    calls: list[dict[str, Any]] = []
    if tools_active and not answer_started:
        function_parser = FunctionCallParser(request.tools, tool_call_parser)
        if function_parser.has_tool_call(text):
            text, call_infos = function_parser.parse_non_stream(text)
            calls = [{"name": call.name, "arguments": call.parameters} for call in call_infos]
    # The response message as serving_chat builds it: content never null, empty reasoning reported as null.
    return {"reasoning_content": reasoning or None, "content": text or "", "tool_calls": calls}


def chat_request_verdict(body: dict[str, Any]) -> str | None:
    """FastAPI's validation of a `/v1/chat/completions` body: SGLang's `ChatCompletionRequest` model."""
    import pydantic
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    try:
        ChatCompletionRequest.model_validate(body)
    except pydantic.ValidationError as error:
        return str(error)
    return None


def _tokenizer(model_dir: str, trust_remote_code: bool) -> Any:
    cache = _STATE.setdefault("tokenizers", {})
    if model_dir not in cache:
        from transformers import AutoTokenizer

        cache[model_dir] = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    return cache[model_dir]


def chat_output_text(
    *,
    model_dir: str,
    trust_remote_code: bool,
    tool_call_parser: str | None,
    output_ids: list[int],
    finish_reason: dict[str, Any] | None,
    skip_special_tokens: bool,
) -> str:
    """The text the chat endpoint's parsers receive for `output_ids`: the detokenizer's own stop trimming
    (`DetokenizerManager.trim_matched_stop`: the matched stop token goes, unless it closes a tool call),
    then decoding as it decodes."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.parser.response_template import tool_close_token_ids

    tokenizer = _tokenizer(model_dir, trust_remote_code)
    detokenizer = types.SimpleNamespace(
        is_tool_call_parser_gpt_oss=tool_call_parser == "gpt-oss",
        tool_close_token_ids=tool_close_token_ids(tool_call_parser, tokenizer),
    )
    trimmed = DetokenizerManager.trim_matched_stop(detokenizer, list(output_ids), finish_reason, False)
    return str(tokenizer.decode(trimmed, skip_special_tokens=skip_special_tokens))


def penalizers_required(params: dict[str, Any]) -> list[str]:
    """The sampling parameters whose penalizer SGLang runs for a request with `params`: each of
    `penaltylib`'s penalizers asked `_is_required` over a batch of that one request, as
    `BatchedPenalizerOrchestrator` asks them. Their state is built from the tokens generated since the request's
    (re-)prefill, so these are what a retraction (`Req.reset_for_retract`) starts again."""
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.sampling_params import SamplingParams

    request = types.SimpleNamespace(sampling_params=SamplingParams(**params))

    class Batch:  # the orchestrator's one method the penalizers' `_is_required` reads (held by weak reference)
        def reqs(self) -> list[Any]:
            return [request]

    batch = Batch()
    penalizers = {
        "frequency_penalty": penaltylib.BatchedFrequencyPenalizer,
        "presence_penalty": penaltylib.BatchedPresencePenalizer,
        "repetition_penalty": penaltylib.BatchedRepetitionPenalizer,
        "min_new_tokens": penaltylib.BatchedMinNewTokensPenalizer,
    }
    return [name for name, penalizer in penalizers.items() if penalizer(batch).is_required()]


def retract(output_ids: list[int], times: int) -> dict[str, Any]:
    """SGLang's `Req.reset_for_retract`, run `times` on a request's state as the scheduler retracts it (its KV
    already released): the count it keeps (tokenizer_manager reports it as meta_info.num_retractions) and the
    output_ids it keeps for the re-prefill of prompt + output."""
    from sglang.srt.managers.schedule_batch import Req

    state = types.SimpleNamespace(
        retraction_count=0, output_ids=list(output_ids), input_embeds=None, kv=types.SimpleNamespace(holds_kv=False)
    )
    for _ in range(times):
        Req.reset_for_retract(state)
    return {"retraction_count": state.retraction_count, "output_ids": list(state.output_ids)}


def max_new_tokens_for_memory(input_tokens: int, max_new_tokens: int, token_capacity: int, page_size: int) -> int:
    """SGLang's cap of a request's new tokens to its KV pool (`BaseTokenToKVPoolAllocator.max_new_tokens_for_memory`,
    as `Scheduler.init_req_max_new_tokens` calls it), on an allocator of `page_size`."""
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator

    allocator = types.SimpleNamespace(page_size=page_size)
    capped = BaseTokenToKVPoolAllocator.max_new_tokens_for_memory(
        allocator, input_tokens, max_new_tokens, token_capacity=token_capacity, sliding_window_size=None,
        chunk_size=None,
    )  # fmt: skip
    return int(capped)


class _TemplateCall:
    """A tokenizer that records what `apply_chat_template` receives (the chat template's own inputs)."""

    chat_template = "{{ messages }}"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        self.calls.append({"messages": messages, "tools": kwargs.get("tools"), "tokenize": kwargs.get("tokenize")})
        return [1] if kwargs.get("tokenize") else "rendered"

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        return [1]

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return "rendered"


def template_inputs(body: dict[str, Any]) -> dict[str, Any]:
    """What the chat template gets for a `/v1/chat/completions` body: `OpenAIServingChat._process_messages` (the
    server's own message processing and tool dump, `_apply_jinja_template`) on SGLang's request model, its
    tokenizer replaced by one that records the `apply_chat_template` call. A launch without a reasoning or tool
    parser and a string-format Jinja template (what every family here is detected as)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    request = ChatCompletionRequest.model_validate(body)
    tokenizer = _TemplateCall()
    serving = object.__new__(OpenAIServingChat)  # the handler's state, not its constructor (no tokenizer manager)
    state = {
        "is_minimax_m3": False, "is_gpt_oss": False, "is_gemma4": False, "default_chat_template_kwargs": {},
        "reasoning_parser": None, "tool_call_parser": None, "_reasoning_detector": None, "_encoding_adapter": None,
        "chat_encoding_spec": None, "_prompt_text_round_trip_is_lossy": False,
        "_tokenizer_auto_adds_specials": False, "_chat_template_cache": {},
        "template_manager": types.SimpleNamespace(
            reasoning_config=None, jinja_template_content_format="string", force_reasoning=False,
            jinja_template_may_reorder_tool_results=False, chat_template_name=None, python_chat_template=None,
        ),
        "tokenizer_manager": types.SimpleNamespace(tokenizer=tokenizer, served_model_name="m"),
    }  # fmt: skip
    for name, value in state.items():
        setattr(serving, name, value)
    serving._process_messages(request, is_multimodal=False)
    [call] = tokenizer.calls
    return {"messages": call["messages"], "tools": call["tools"]}


def chat_tools_verdict(tools: list[Any]) -> dict[str, Any]:
    """A chat request carrying `tools`, as serving_chat admits it: FastAPI's validation (`ChatCompletionRequest`,
    its `Tool` models), then `_validate_request`, which rewrites each tool's parameter types in place before the
    template renders them (`normalize_json_schema_types`) and checks the schema. {"refused": text} or
    {"functions": each tool's `function` as the request then holds it, its unset fields left out}."""
    import pydantic
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    try:
        request = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": tools}
        )
    except pydantic.ValidationError as error:
        return {"refused": str(error)}
    serving = types.SimpleNamespace(is_minimax_m3=False, _validate_media_content=lambda request: None)
    serving._effective_tools = types.MethodType(OpenAIServingChat._effective_tools, serving)
    refusal = OpenAIServingChat._validate_request(serving, request)
    if refusal is not None:
        return {"refused": refusal}
    return {"functions": [tool.function.model_dump(exclude_unset=True) for tool in request.tools or []]}


def schema_types(schemas: list[Any]) -> list[Any]:
    """Each schema as SGLang's `normalize_json_schema_types` leaves it (it rewrites in place)."""
    import copy

    from sglang.srt.function_call.utils import normalize_json_schema_types

    out = []
    for schema in schemas:
        schema = copy.deepcopy(schema)
        normalize_json_schema_types(schema)
        out.append(schema)
    return out


def template_content(messages: list[dict[str, Any]], chat_template: str) -> dict[str, Any]:
    """What serving_chat's `_apply_jinja_template` hands a Jinja chat template for `messages`: the request
    validated (`ChatCompletionRequest`) and dumped, each message's content processed for the template's content
    format (`detect_jinja_template_content_format`, `process_content_for_template_format`) and a tool message's
    text parts joined (`normalize_tool_content`). {"format", "messages"}, or {"refused": text}."""
    import pydantic
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import normalize_tool_content
    from sglang.srt.parser.jinja_template_utils import (
        detect_jinja_template_content_format,
        process_content_for_template_format,
    )

    form = detect_jinja_template_content_format(chat_template)
    try:
        request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages})
    except pydantic.ValidationError as error:
        return {"refused": str(error)}
    out = []
    for message in [message.model_dump() for message in request.messages]:
        if message.get("content") is None:
            message["content"] = ""
        processed = process_content_for_template_format(message, form, [], [], [], [])
        processed["content"] = normalize_tool_content(processed["role"], processed.get("content"))
        out.append(processed)
    return {"format": form, "messages": out}


def tool_call_parse(tool_call_parser: str, tools: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """What the chat endpoint's `_process_tool_calls` finds in `text` (a request declaring `tools`, tool_choice
    auto): SGLang's FunctionCallParser `has_tool_call`, then `parse_non_stream` where it found one."""
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    parser = FunctionCallParser([Tool.model_validate(tool) for tool in tools], tool_call_parser)
    if not parser.has_tool_call(text):
        return {"found": False, "normal_text": text, "calls": []}
    normal_text, calls = parser.parse_non_stream(text)
    return {
        "found": True,
        "normal_text": normal_text,
        "calls": [{"name": call.name, "arguments": call.parameters} for call in calls],
    }


def tool_call_opener(tool_call_parser: str) -> str:
    """The text SGLang's detector for `tool_call_parser` looks for in `has_tool_call` (its `bot_token`)."""
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    return str(FunctionCallParser.ToolCallParserEnum[tool_call_parser]().bot_token)


def kept_stop_ids(
    model_dir: str, trust_remote_code: bool, tool_call_parser: str | None, stop_ids: list[int]
) -> list[int]:
    """Of `stop_ids`, those the detokenizer keeps when one ends an output as its matched stop token
    (`DetokenizerManager.trim_matched_stop`, the launch's tool-call parser given)."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager
    from sglang.srt.parser.response_template import tool_close_token_ids

    tokenizer = _tokenizer(model_dir, trust_remote_code)
    detokenizer = types.SimpleNamespace(
        is_tool_call_parser_gpt_oss=tool_call_parser == "gpt-oss",
        tool_close_token_ids=tool_close_token_ids(tool_call_parser, tokenizer),
    )
    return [
        stop_id
        for stop_id in stop_ids
        if DetokenizerManager.trim_matched_stop(detokenizer, [1, stop_id], {"type": "stop", "matched": stop_id}, False)
        == [1, stop_id]
    ]


def resolve_max_num_reqs(token_capacity: int, context_len: int, requested: int | None, attn_dp_size: int) -> int:
    """A DP rank's running-request limit (`KVCacheConfigurator.resolve_max_num_reqs`, as `configure` calls it
    once the pool is sized) for a launch with `--max-running-requests requested`, a dense model (no mamba state)."""
    from sglang.srt.mem_cache import kv_cache_configurator as module

    configurator = types.SimpleNamespace(
        model_config=types.SimpleNamespace(context_len=context_len), attn_dp_size=attn_dp_size, mambaish_config=None
    )
    schedule = types.SimpleNamespace(max_running_requests=requested)
    real = module.get_schedule
    module.get_schedule = lambda: schedule
    try:
        return int(module.KVCacheConfigurator.resolve_max_num_reqs(configurator, token_capacity))
    finally:
        module.get_schedule = real
