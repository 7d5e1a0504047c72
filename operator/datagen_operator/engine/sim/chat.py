"""`/v1/chat/completions`: OpenAI request in, chat template rendered, reasoning and tool calls split out.

SGLang applies the launch-time `--reasoning-parser` and `--tool-call-parser` here (and only here), on text
decoded with special tokens kept when the request has tools or the model is gpt-oss (serving_chat.py).
Stream chunk boundaries differ from SGLang's (text is cut into fixed-size pieces), but the deltas
concatenate to the non-streaming message.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from datagen_operator.engine.chat_tools import request_tool
from datagen_operator.engine.reasoning import DETECTORS, force_reasoning, split_reasoning
from datagen_operator.engine.sim.model import Completion
from datagen_operator.engine.sim.protocol import RequestError
from datagen_operator.engine.sim.sampling import SamplingParams, SamplingParamsError, parse_sampling_params
from datagen_operator.engine.sim.vocab import SimVocab
from datagen_operator.engine.template_tools import template_tools
from datagen_operator.engine.tool_calls import read_tool_calls

KIMI_K2_TOOL_PARSER = "kimi_k2"
GPT_OSS_MODEL_TYPE = "gpt_oss"

STREAM_PIECE_CHARS = 24

# OpenAI / SGLang chat fields -> /generate sampling_params keys.
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "seed": "sampling_seed",
    "n": "n",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "min_tokens": "min_new_tokens",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
}


def openai_error(message: str, status: int = 400) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_vars: dict[str, Any]
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str | None
    separate_reasoning: bool


def parse_chat_request(body: object, vocab: SimVocab | None = None) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise RequestError("messages must be a non-empty list of objects with a role.")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("tools must be a list.")
    if body.get("tool_choice") == "none":
        tools = None
    if tools:
        tools = [request_tool(tool) for tool in tools]  # SGLang's request validation rewrites type names
    raw = {key: body[field] for field, key in _SAMPLING_FIELDS.items() if body.get(field) is not None}
    # Tool calls and harmony channels are special tokens: SGLang keeps them in the decoded text.
    gpt_oss = vocab is not None and vocab.model_config.get("model_type") == GPT_OSS_MODEL_TYPE
    if tools or gpt_oss:
        raw["skip_special_tokens"] = False
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    raw["max_new_tokens"] = max_tokens
    try:
        params = parse_sampling_params(raw)
    except SamplingParamsError as error:
        raise RequestError(str(error)) from None
    template_vars = body.get("chat_template_kwargs") or {}
    if not isinstance(template_vars, dict):
        raise RequestError("chat_template_kwargs must be an object.")
    stream_options = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages,
        tools=tools or None,
        template_vars=template_vars,
        params=params,
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)) if isinstance(stream_options, dict) else False,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        separate_reasoning=body.get("separate_reasoning", True) is not False,
    )


def render_prompt(request: ChatRequest, vocab: SimVocab) -> list[int]:
    if vocab.chat_template is None:
        raise RequestError("The tokenizer has no chat template; pass --chat-template.")
    from datagen_operator.engine.chat_content import content_format, template_messages
    from datagen_operator.tokenizer.chat_template import render_chat  # jinja2 loads on the first chat request

    try:
        text = render_chat(
            vocab.chat_template,
            template_messages(request.messages, content_format(vocab.chat_template)),
            tools=template_tools(request.tools),  # as SGLang dumps them for the template
            add_generation_prompt=True,
            **{**vocab.special_tokens, **request.template_vars},  # transformers passes bos_token & co.
        )
    except Exception as error:  # a template error is the client's (its messages), reported as a 400
        raise RequestError(f"Failed to apply the chat template: {error}") from None
    return vocab.encode(text)


@dataclass(frozen=True, slots=True)
class ChatChoice:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    matched_stop: int | str | None
    completion_tokens: int
    reasoning_tokens: int


def _reasoning_tokens(completion: Completion, reasoning: str | None, vocab: SimVocab) -> int:
    if reasoning is None:
        return 0
    end_id = vocab.runs.think_end_id
    end = completion.run.find_first((end_id,)) if end_id is not None else None
    return end[0] if end is not None else len(vocab.encode(reasoning))


def _history_tool_calls(messages: Sequence[dict[str, Any]]) -> int:
    return sum(len(message.get("tool_calls") or ()) for message in messages if message.get("role") == "assistant")


def chat_choice(
    completion: Completion,
    request: ChatRequest,
    vocab: SimVocab,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
) -> ChatChoice:
    """The message SGLang builds from one completion: reasoning split, then tool calls from what remains."""
    text, reasoning = completion.text, None
    if reasoning_parser in DETECTORS and request.separate_reasoning:
        forced = force_reasoning(reasoning_parser, vocab.chat_template, request.template_vars)
        split = split_reasoning(text, reasoning_parser, forced)
        reasoning, text = split.reasoning, split.content
    calls: list[dict[str, Any]] = []
    finish = dict(completion.finish_reason)
    if tool_call_parser and request.tools:
        parsed = read_tool_calls(tool_call_parser, text, request.tools)
        text = parsed.normal_text
        history = _history_tool_calls(request.messages)
        for index, call in enumerate(parsed.calls):
            call_id = (
                f"functions.{call.name}:{history + index}"
                if tool_call_parser == KIMI_K2_TOOL_PARSER
                else f"call_{uuid.uuid4().hex[:24]}"
            )
            function = {"name": call.name, "arguments": call.arguments}
            calls.append({"id": call_id, "index": index, "type": "function", "function": function})
        if calls and finish["type"] == "stop":
            finish = {"type": "tool_calls", "matched": None}
    return ChatChoice(
        reasoning=reasoning,
        content=text,
        tool_calls=calls,
        finish_reason=str(finish["type"]),
        matched_stop=finish.get("matched") if finish["type"] in ("stop", "tool_calls") else None,
        completion_tokens=len(completion.run),
        reasoning_tokens=_reasoning_tokens(completion, reasoning, vocab),
    )


def usage(prompt_tokens: int, choices: Sequence[ChatChoice]) -> dict[str, Any]:
    completion_tokens = sum(choice.completion_tokens for choice in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": sum(choice.reasoning_tokens for choice in choices),
    }


def chat_response(
    response_id: str, created: int, model: str, prompt_tokens: int, choices: Sequence[ChatChoice]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "message": {
                    "role": "assistant",
                    "content": choice.content,
                    "reasoning_content": choice.reasoning,
                    "tool_calls": choice.tool_calls or None,
                },
                "logprobs": None,
                "finish_reason": choice.finish_reason,
                "matched_stop": choice.matched_stop,
            }
            for index, choice in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, choices),
    }


def _pieces(text: str | None) -> list[str]:
    if not text:
        return []
    return [text[start : start + STREAM_PIECE_CHARS] for start in range(0, len(text), STREAM_PIECE_CHARS)]


def chat_stream_chunks(
    response_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    choices: Sequence[ChatChoice],
    include_usage: bool,
) -> Iterator[tuple[float, dict[str, Any]]]:
    """(share of the output generated when due, chunk) for each chunk of an OpenAI chat stream."""

    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}],
        }

    for index, choice in enumerate(choices):
        deltas: list[dict[str, Any]] = [{"reasoning_content": piece} for piece in _pieces(choice.reasoning)]
        deltas += [{"content": piece} for piece in _pieces(choice.content)]
        if choice.tool_calls:
            deltas.append({"tool_calls": choice.tool_calls})
        yield 0.0, chunk(index, {"role": "assistant", "content": ""})
        for number, delta in enumerate(deltas, start=1):
            yield number / len(deltas), chunk(index, delta)
        yield 1.0, chunk(index, {}, choice.finish_reason, matched_stop=choice.matched_stop)
    if include_usage:
        yield (
            1.0,
            {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage(prompt_tokens, choices),
            },
        )
