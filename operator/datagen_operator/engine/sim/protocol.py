"""/generate request parsing and response bodies, as pure functions (SGLang 0.5.23
sglang/srt/managers/io_struct.py `GenerateReqInput`, sglang/srt/entrypoints/http_server.py `generate_request`).

Bodies are assembled from pre-serialized pieces: `output_ids` JSON comes straight from the token run's
cached digits, so a 4,000-token answer costs a few slices and one `orjson.dumps` of the text.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from codecs import getincrementaldecoder
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from datagen_operator.engine.sim.model import Completion
from datagen_operator.engine.sim.sampling import (
    SamplingParams,
    SamplingParamsError,
    check_contract,
    check_kind,
    parse_sampling_params,
    shown,
)
from datagen_operator.engine.sim.vocab import SimVocab

WEIGHT_VERSION = "default"
SSE_DONE = b"data: [DONE]\n\n"


class RequestError(ValueError):
    """A 400 with SGLang's body shape."""

    def __init__(self, message: str, *, flat: bool = False, status: int = 400) -> None:
        super().__init__(message)
        self.flat = flat
        self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": str(self)} if self.flat else {"error": {"message": str(self)}}


@dataclass(frozen=True, slots=True)
class GenerateItem:
    """One prompt (one sample) of a /generate request, validated."""

    prompt: array[int]
    params: SamplingParams
    rid: str
    sample_index: int
    max_new_tokens: int
    """max_new_tokens clamped to the context length."""
    index: int
    """Position in the response array (batch order)."""


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    items: list[GenerateItem]
    is_batch: bool
    stream: bool
    return_logprob: bool
    return_prompt_token_ids: bool


def new_rid() -> str:
    return os.urandom(16).hex()


# The top-level keys the simulator reads, with their JSON kind in SGLang's request schema (`sglang/api/v1`).
BODY_KINDS: dict[str, str] = {
    "text": "str_or_list", "stream": "bool", "rid": "str_or_list", "return_logprob": "bool_or_list",
    "return_prompt_token_ids": "bool",
}  # fmt: skip


def _check_body_contract(body: dict[str, Any]) -> None:
    """SGLang's HTTP contract gate: a value of the wrong JSON type is a flat 400, before anything else."""
    try:
        for key, kind in BODY_KINDS.items():
            if body.get(key) is not None:
                check_kind(body[key], kind)
        input_ids = body.get("input_ids")
        if input_ids is not None:
            if not isinstance(input_ids, list):
                raise RequestError(
                    f"invalid type: {shown(input_ids)}, expected a value or an array of values for TokenIdsOrList",
                    flat=True,
                )
            # [] and [number, ...] are one prompt; anything else is a batch of prompts.
            one_prompt = not input_ids or (isinstance(input_ids[0], int | float) and not isinstance(input_ids[0], bool))
            for ids in [input_ids] if one_prompt else input_ids:
                check_kind(ids, "int_list")
        raw_params = body.get("sampling_params")
        if isinstance(raw_params, list):
            for raw in raw_params:
                check_contract(raw)
        elif raw_params is not None and not isinstance(raw_params, dict):
            raise RequestError(
                f"invalid type: {shown(raw_params)}, expected a value or an array of values for SamplingParamsOrList",
                flat=True,
            )
        elif raw_params is not None:
            check_contract(raw_params)
    except SamplingParamsError as error:
        raise RequestError(str(error), flat=True) from None


def _prompts(body: dict[str, Any], vocab: SimVocab, skip_tokenizer_init: bool) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is None and input_ids is None:
        raise RequestError("Either text, input_ids or input_embeds should be provided.")
    if input_ids is not None:  # input_ids win over text, as in SGLang's tokenizer manager
        if not input_ids:
            raise RequestError("input_ids cannot be empty.")
        if isinstance(input_ids[0], list):
            return input_ids, True
        return [input_ids], False
    if skip_tokenizer_init:
        raise RequestError("text input needs the tokenizer; the server runs with --skip-tokenizer-init.")
    if isinstance(text, str):
        return [vocab.encode(text)], False
    if isinstance(text, list) and text and all(isinstance(item, str) for item in text):
        return [vocab.encode(item) for item in text], True
    raise RequestError("text must be a string or a non-empty list of strings.")


def _prompt_array(ids: object, vocab_size: int) -> array[int]:
    if not isinstance(ids, list) or not ids:
        raise RequestError("Each prompt must be a non-empty list of token ids.")
    try:
        prompt = array("I", ids)
    except (TypeError, OverflowError):
        raise RequestError("input_ids must hold non-negative integer token ids.") from None
    if max(prompt) >= vocab_size:
        raise RequestError(f"Token id {max(prompt)} is out of vocabulary (size {vocab_size}).")
    return prompt


def _check_length(prompt_tokens: int, raw_params: object, context_length: int, reserved_tokens: int = 0) -> None:
    """SGLang refuses (never shortens) a prompt that fills the context, or an explicit max_new_tokens that
    would overrun it; texts as `TokenizerManager._validate_one_request` words them. An absent or null
    max_new_tokens is not checked there (the answer then stops at the context). Both checks count the
    `reserved_tokens` (EAGLE's draft tokens) as input, and so do the texts."""
    input_tokens = prompt_tokens + reserved_tokens
    if input_tokens >= context_length:
        raise RequestError(
            f"The input ({input_tokens} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    max_new_tokens = raw_params.get("max_new_tokens") if isinstance(raw_params, dict) else None
    if max_new_tokens is not None and max_new_tokens + input_tokens > context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {max_new_tokens + input_tokens} tokens: {input_tokens} tokens from the "
            f"input messages and {max_new_tokens} tokens for the completion. Please reduce the number of tokens "
            "in the input messages or the completion to fit within the limit."
        )


def _rids(rid: object, count: int, is_batch: bool) -> list[str]:
    if rid is None:
        return [new_rid() for _ in range(count)]
    if isinstance(rid, str):
        return [f"{rid}_{index}" for index in range(count)] if is_batch else [rid]
    if isinstance(rid, list) and len(rid) == count and all(isinstance(item, str) for item in rid):
        return list(rid)
    raise RequestError("rid must be a string or a list of strings, one per prompt.")


def scheduler_max_new_tokens(prompt_tokens: int, requested: int | None, context_length: int) -> int:
    """The scheduler's cap (`Scheduler.init_req_max_new_tokens`): `max_req_len - input_len - 1`, `max_req_len`
    being the context less one, so an admitted request ends two tokens short of the context."""
    room = max(0, context_length - prompt_tokens - 2)
    return room if requested is None else min(requested, room)


def parse_generate_request(
    body: object, vocab: SimVocab, context_length: int, skip_tokenizer_init: bool = False, *, reserved_tokens: int = 0
) -> GenerateRequest:
    """Validate a /generate body; RequestError (a 400) names the first problem. `reserved_tokens`: the
    tokenizer manager's `num_reserved_tokens` (speculative decoding's draft tokens)."""
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    _check_body_contract(body)
    prompts, is_batch = _prompts(body, vocab, skip_tokenizer_init)
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if not is_batch or len(raw_params) != len(prompts):
            raise RequestError("A list of sampling_params needs a batch of as many prompts.")
        raw_list = raw_params
    else:
        raw_list = [raw_params] * len(prompts)
    # Per prompt, in SGLang's order: the length check (tokenizer manager), then SamplingParams.verify.
    params_list = []
    for ids, raw in zip(prompts, raw_list, strict=True):
        prompt = _prompt_array(ids, vocab.size)
        _check_length(len(prompt), raw, context_length, reserved_tokens)
        try:
            params_list.append(parse_sampling_params(raw))
        except SamplingParamsError as error:
            raise RequestError(str(error), flat=error.flat) from None
    samples = max(params.n for params in params_list)
    is_batch = is_batch or samples > 1  # n > 1 answers with a list, one entry per sample
    rids = _rids(body.get("rid"), len(prompts) * samples if samples > 1 else len(prompts), is_batch)
    items: list[GenerateItem] = []
    for prompt_index, (ids, params) in enumerate(zip(prompts, params_list, strict=True)):
        prompt = _prompt_array(ids, vocab.size)
        max_new = scheduler_max_new_tokens(len(prompt), params.max_new_tokens, context_length)
        for sample in range(params.n):
            index = len(items)
            rid = rids[index] if samples > 1 else rids[prompt_index]
            items.append(GenerateItem(prompt, params, rid, sample, max_new, index))
    return GenerateRequest(
        items=items,
        is_batch=is_batch,
        stream=bool(body.get("stream", False)),
        return_logprob=bool(body.get("return_logprob", False)),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids", False)),
    )


def meta_info(
    rid: str,
    finish_reason: dict[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    e2e_latency: float | None,
    num_retractions: int = 0,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "reasoning_tokens": 0,  # /generate never runs the reasoning parser
        "weight_version": WEIGHT_VERSION,
        "num_retractions": num_retractions,  # Req.retraction_count, as tokenizer_manager reports it
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    return meta


def fake_logprob(token_id: int) -> float:
    """A deterministic stand-in log probability (the simulator has no model)."""
    return -((token_id * 2654435761) % 10007) / 10007 * 4


def logprob_fields(prompt: Sequence[int], output_ids: Sequence[int]) -> dict[str, Any]:
    return {
        "input_token_logprobs": [[None if index == 0 else fake_logprob(t), t, None] for index, t in enumerate(prompt)],
        "output_token_logprobs": [[fake_logprob(token_id), token_id, None] for token_id in output_ids],
    }


def leaked_prefix(prompt: array[int], leak: int) -> list[int]:
    """The upstream bug (sglang 10896, 17240): the last prompt tokens reappear at the start of output_ids."""
    return prompt[-leak:].tolist() if leak else []


def generate_body(
    item: GenerateItem,
    completion: Completion,
    meta: dict[str, Any],
    leak: list[int],
    request: GenerateRequest,
) -> bytes:
    """One non-streaming result object, serialized."""
    ids_json = completion.run.json_ids()
    if leak:
        ids_json = orjson.dumps(leak)[1:-1] + (b"," + ids_json if ids_json else b"")
    if request.return_logprob:
        meta = {**meta, **logprob_fields(item.prompt, leak + completion.run.ids())}
    extra = b""
    if request.return_prompt_token_ids:
        extra = b',"prompt_token_ids":' + orjson.dumps(item.prompt.tolist())
    return b"".join(
        (
            b'{"text":',
            orjson.dumps(completion.text),
            b',"output_ids":[',
            ids_json,
            b'],"meta_info":',
            orjson.dumps(meta),
            extra,
            b"}",
        )
    )


class StreamEvent(NamedTuple):  # a tuple: one is made per streamed token
    tokens: int
    """Completion tokens generated when this event is due (for pacing)."""
    data: bytes
    """The serialized SSE event; empty for the final event, which the caller serializes from `payload`
    once it knows e2e_latency."""
    payload: dict[str, Any] | None = None


def stream_event_count(tokens: int, interval: int) -> int:
    return max(1, -(-tokens // interval))


def stream_events(
    item: GenerateItem,
    completion: Completion,
    meta: dict[str, Any],
    leak: list[int],
    *,
    interval: int,
    incremental: bool,
    batch_index: int | None,
    vocab: SimVocab,
) -> Iterator[StreamEvent]:
    """SGLang's stream for one request, generated lazily: an event every `interval` tokens, cumulative
    `text` and `output_ids` by default, disjoint deltas when `incremental`; the last event carries
    finish_reason. The concatenated (or last cumulative) text equals the non-streaming `text`.

    Events other than the last are written from pre-serialized pieces (a few microseconds each): a
    4,000-token answer streams as 4,000 events."""
    ids = completion.run.ids()
    final_text = completion.text
    table = vocab.text_bytes if item.params.skip_special_tokens else vocab.token_bytes
    decoder = getincrementaldecoder("utf-8")("replace")
    count = len(ids)
    meta_head = orjson.dumps({key: meta[key] for key in ("id", "finish_reason", "prompt_tokens")})[:-1]
    meta_head += b',"completion_tokens":'
    rest = {
        key: value
        for key, value in meta.items()
        if key not in ("id", "finish_reason", "prompt_tokens", "completion_tokens")
    }
    meta_tail = (
        b"," + orjson.dumps(rest)[1:] + (b',"index":%d}\n\n' % batch_index if batch_index is not None else b"}\n\n")
    )
    cumulative_ids = bytearray(orjson.dumps(leak)[1:-1])
    decoded_chars = sent_chars = sent_ids = 0
    for end in [*range(interval, count, interval), count]:
        final = end == count
        new_ids = ids[sent_ids:end]
        piece = table[new_ids[0]] if len(new_ids) == 1 else b"".join(map(table.__getitem__, new_ids))
        decoded_chars += len(decoder.decode(piece, final))
        chars = len(final_text) if final else min(decoded_chars, len(final_text))
        if final:
            if incremental:
                text, out_ids = final_text[sent_chars:], (leak + new_ids if sent_ids == 0 and leak else new_ids)
            else:
                text, out_ids = final_text, leak + ids if leak else ids
            payload: dict[str, Any] = {
                "text": text,
                "output_ids": out_ids,
                "meta_info": {**meta, "finish_reason": completion.finish_reason, "completion_tokens": end},
            }
            if batch_index is not None:
                payload["index"] = batch_index
            yield StreamEvent(end, b"", payload)
            return
        ids_json: bytes | bytearray = (
            b"%d" % new_ids[0] if len(new_ids) == 1 else b",".join(b"%d" % token for token in new_ids)
        )
        if incremental:
            text = final_text[sent_chars:chars]
            if sent_ids == 0 and leak:
                ids_json = cumulative_ids + b"," + ids_json
        else:
            text = final_text[:chars]
            if cumulative_ids:
                cumulative_ids += b","
            cumulative_ids += ids_json
            ids_json = cumulative_ids
        data = b"".join(
            (b'data: {"text":', orjson.dumps(text), b',"output_ids":[', ids_json, b'],"meta_info":', meta_head,
             b"%d" % end, meta_tail)
        )  # fmt: skip
        yield StreamEvent(end, data)
        sent_chars, sent_ids = chars, end


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def stream_error_payload(message: str, code: int = 400) -> dict[str, Any]:
    """The event SGLang streams when a request fails mid-stream (a ValueError in `http_server.generate_request`),
    before `[DONE]`: always `invalid_request_error`, never retryable."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


QUEUE_FULL_MESSAGE = "The request queue is full."


def queue_full_finish_reason() -> dict[str, Any]:
    """How SGLang's scheduler finishes a request it sheds for a full waiting queue (`_abort_on_queued_limit`)."""
    return {"type": "abort", "status_code": 503, "message": QUEUE_FULL_MESSAGE}


def abort_response(finish_reason: dict[str, Any] | None) -> tuple[int, dict[str, Any]] | None:
    """How a non-streaming request that the scheduler aborted with an HTTP status is answered
    (`TokenizerManager._handle_abort_finish_reason`): a 400 as `{"error": {"message"}}`, any other status as
    FastAPI's HTTPException through SGLang's handler (an `ErrorResponse`). None: answered as a normal result."""
    if not finish_reason or finish_reason.get("type") != "abort":
        return None
    status = finish_reason.get("status_code")
    if status is None or not 400 <= status < 600:
        return None
    message = finish_reason.get("message") or ""
    if status == 400:
        return status, {"error": {"message": message}}
    return status, {"object": "error", "message": message, "type": str(status), "param": None, "code": status}


# KV-cache capacity in tokens, measured from free GPU memory at start-up: a multiple of the context, plus
# up to this fraction more that differs between replicas and restarts as real measurements do.
KV_CAPACITY_CONTEXTS = 4
KV_CAPACITY_JITTER = 0.02
# SGLang reserves these tokens below min(context, KV capacity) - 1 for the longest input (`tp_worker.py`).
MAX_INPUT_MARGIN = 5


def _share(key: str) -> float:
    """A number in [0, 1) fixed by `key`."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


def kv_capacity(context_length: int, replica_key: str) -> int:
    """`max_total_num_tokens` of one replica: seeded by `replica_key` (port and seed), so replicas differ."""
    return KV_CAPACITY_CONTEXTS * context_length + int(context_length * KV_CAPACITY_JITTER * _share(replica_key))


def dp_rank_capacities(context_length: int, server_key: str, dp_size: int, attn_dp_size: int) -> list[int]:
    """The KV capacity of each DP rank of one server (`dp_size * attn_dp_size` of them): each data-parallel
    replica is its own TP group and measures its own free memory; attention-DP ranks share one TP group, whose
    measurement is the minimum over its GPUs, so they all hold the same."""
    replicas = [kv_capacity(context_length, f"{server_key}:dp{rank}") for rank in range(dp_size)]
    return [capacity for capacity in replicas for _ in range(attn_dp_size)]


def loading_order(server_key: str, dp_size: int) -> list[int]:
    """The order the data-parallel replicas finish loading in: they load in parallel, so any order."""
    return sorted(range(dp_size), key=lambda rank: _share(f"{server_key}:loaded{rank}"))


def reported_capacity(capacities: Sequence[int], order: Sequence[int], attn_dp_size: int) -> int:
    """The `max_total_num_tokens` `/server_info` reports: the data-parallel controller keeps the first scheduler's
    figure of each TP group as the group reports ready (`_record_scheduler_init_infos`), so the last replica to
    finish loading wins; not the smallest, nor replica 0's."""
    return capacities[order[-1] * attn_dp_size]


def input_length_refusal(request: GenerateRequest, max_input: int) -> RequestError | None:
    """The scheduler's own length check (`validate_input_length`), after the tokenizer manager's: an input of
    `max_req_input_len` tokens or more is aborted with status 400 (a 400 body, or an abort chunk when streaming)."""
    for item in request.items:
        if len(item.prompt) >= max_input:
            return RequestError(
                f"Input length ({len(item.prompt)} tokens) exceeds the maximum allowed length ({max_input} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )
    return None


def max_req_input_len(context_length: int, capacity: int) -> int:
    """The longest input the scheduler admits (minus one): `min(context - 1, capacity - 1) - 5`."""
    return min(context_length - 1, capacity - 1) - MAX_INPUT_MARGIN
