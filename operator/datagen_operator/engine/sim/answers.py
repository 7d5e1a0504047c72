"""The generation endpoints' answers written to the wire: /generate's whole (one request or a batch) or as a
stream paced event by event, the chat endpoint's, and the faults that cut them (a reset connection, an error
mid-stream). What each answer holds is decided before (server.py); its pacing is the running batch's (batch.py)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import socket
import struct
import time
from array import array
from typing import Any

import orjson
from aiohttp import web

from datagen_operator.engine.sim import chat, protocol
from datagen_operator.engine.sim.batch import RunningBatch
from datagen_operator.engine.sim.config import FaultConfig
from datagen_operator.engine.sim.faults import FaultPlan
from datagen_operator.engine.sim.model import Completion
from datagen_operator.engine.sim.prefix_cache import Hold
from datagen_operator.engine.sim.protocol import GenerateItem, GenerateRequest
from datagen_operator.engine.sim.vocab import SimVocab

STREAM_WRITE_BYTES = 64 * 1024  # coalesce stream events into writes of about this size at wire speed
JSON = "application/json"


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON)


def _reset_connection(request: web.Request) -> None:
    """Close the client's connection with a TCP RST (SO_LINGER 0), as a crashed peer or proxy would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _flushed(request: web.Request, timeout_s: float = 1.0) -> None:
    """Wait until the transport has handed its buffer to the kernel (so a reset comes after the data)."""
    deadline = time.monotonic() + timeout_s
    transport = request.transport
    # asyncio offers no event for "write buffer empty"; poll briefly (only on fault paths).
    while transport is not None and transport.get_write_buffer_size() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.001)


class AnswerWriter:
    def __init__(
        self, batch: RunningBatch, faults: FaultConfig, args: dict[str, Any], vocab: SimVocab, model_name: str
    ) -> None:
        self.batch = batch
        self.faults = faults
        self.args = args
        """The server's resolved arguments (its streaming and parser flags)."""
        self.vocab = vocab
        self.model_name = model_name

    async def whole(
        self,
        request: web.Request,
        parsed: GenerateRequest,
        completions: list[Completion],
        cached: list[int],
        plan: FaultPlan,
        received: float,
    ) -> web.StreamResponse:
        await self.batch.through_stall()
        if self.batch.gpu or self.batch.metrics is not None:
            await asyncio.gather(
                *(
                    self.batch.run(len(item.prompt), len(c.run), k, received)
                    for item, c, k in zip(parsed.items, completions, cached, strict=True)
                )
            )
        for completion in completions:  # a scheduler abort with an HTTP status fails the whole request
            abort = protocol.abort_response(completion.finish_reason)
            if abort is not None:
                return json_response(abort[1], abort[0])
        leak = self.faults.prompt_suffix_leak
        e2e = time.perf_counter() - received
        bodies = [
            protocol.generate_body(
                item,
                completion,
                protocol.meta_info(
                    item.rid,
                    completion.finish_reason,
                    len(item.prompt),
                    len(completion.run),
                    cached_tokens,
                    e2e,
                    plan.retractions,
                ),
                protocol.leaked_prefix(item.prompt, leak),
                parsed,
            )
            for item, completion, cached_tokens in zip(parsed.items, completions, cached, strict=True)
        ]
        body = b"[" + b",".join(bodies) + b"]" if parsed.is_batch else bodies[0]
        if plan.reset or self.faults.crash_after_requests:
            # Write explicitly: a reset needs half a body on the wire; a crash must not lose the answer.
            response = web.StreamResponse(headers={"Content-Type": JSON})
            response.content_length = len(body)
            await response.prepare(request)
            if plan.reset:
                await response.write(body[: len(body) // 2])
                await _flushed(request)
                _reset_connection(request)
                return response
            await response.write(body)
            await response.write_eof()
            await _flushed(request)
            return response
        return web.Response(body=body, content_type=JSON)

    async def stream(
        self,
        request: web.Request,
        parsed: GenerateRequest,
        completions: list[Completion],
        cached: list[int],
        plan: FaultPlan,
        received: float,
    ) -> web.StreamResponse:
        leak = self.faults.prompt_suffix_leak
        incremental = self.args["incremental_streaming_output"]
        streams = []
        total_events = 0
        for item, completion, cached_tokens in zip(parsed.items, completions, cached, strict=True):
            interval = item.params.stream_interval or self.args["stream_interval"]
            total_events += protocol.stream_event_count(len(completion.run), interval)
            events = protocol.stream_events(
                item,
                completion,
                protocol.meta_info(item.rid, None, len(item.prompt), 0, cached_tokens, None, plan.retractions),
                protocol.leaked_prefix(item.prompt, leak),
                interval=interval,
                incremental=incremental,
                batch_index=item.index if parsed.is_batch else None,
                vocab=self.vocab,
            )
            streams.append((self.batch.due_s(event.tokens), item.index, event) for event in events)
        # Generated lazily (a cumulative stream of a long answer is O(n^2) bytes); a batch interleaves
        # its requests' events by due time at gpu speed.
        merged = heapq.merge(*streams, key=lambda entry: entry[0]) if self.batch.gpu else itertools.chain(*streams)
        cut = total_events // 2 if plan.reset or plan.stream_error else None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async with contextlib.AsyncExitStack() as stack:
            for item, completion, cached_tokens in zip(parsed.items, completions, cached, strict=True):
                if protocol.abort_response(completion.finish_reason) is None:  # a refused request never queues
                    await stack.enter_async_context(self.batch.generating(len(item.prompt), cached_tokens))
            buffer = bytearray()
            start = time.perf_counter()
            for position, (due, _, event) in enumerate(merged):
                if position == cut:
                    break
                if self.batch.stalled_until > time.monotonic():
                    if buffer:
                        await response.write(bytes(buffer))
                        buffer.clear()
                    stalled = time.monotonic()
                    await self.batch.through_stall()
                    start += time.monotonic() - stalled  # no token was made meanwhile
                if self.batch.gpu and due > time.perf_counter() - start:
                    if buffer:
                        await response.write(bytes(buffer))
                        buffer.clear()
                    await asyncio.sleep(due - (time.perf_counter() - start))
                if event.payload is not None:  # the final event of a request
                    event.payload["meta_info"]["e2e_latency"] = time.perf_counter() - received
                    buffer += protocol.sse(event.payload)
                else:
                    buffer += event.data
                if len(buffer) >= STREAM_WRITE_BYTES:
                    await response.write(bytes(buffer))
                    buffer.clear()
            if buffer:
                await response.write(bytes(buffer))
        for item, completion in zip(parsed.items, completions, strict=True):
            self.batch.finished(len(item.prompt), len(completion.run), received)
        if plan.reset:
            await _flushed(request)
            _reset_connection(request)
            return response
        if plan.stream_error:
            message = "Simulated error mid-stream (--sim-fault-stream-error-rate)"
            await response.write(protocol.sse(protocol.stream_error_payload(message)))
        await response.write(protocol.SSE_DONE)
        await response.write_eof()
        return response

    async def chat(
        self,
        request: web.Request,
        parsed: chat.ChatRequest,
        prompt: array[int],
        items: list[GenerateItem],
        completions: list[Completion],
        hold: Hold | None,
        received: float,
    ) -> web.StreamResponse:
        cached = 0 if hold is None else hold.cached
        choices = [
            chat.chat_choice(c, parsed, self.vocab, self.args["reasoning_parser"], self.args["tool_call_parser"])
            for c in completions
        ]
        response_id = protocol.new_rid()
        model = parsed.model or self.model_name
        created = int(time.time())
        if not parsed.stream:
            await asyncio.gather(
                *(
                    self.batch.run(len(i.prompt), len(c.run), cached, received)
                    for i, c in zip(items, completions, strict=True)
                )
            )
            response = json_response(chat.chat_response(response_id, created, model, len(prompt), choices))
            return response
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        total_tokens = max(len(c.run) for c in completions)
        async with self.batch.generating(len(prompt), cached):
            start = time.perf_counter()
            for share, payload in chat.chat_stream_chunks(
                response_id, created, model, len(prompt), choices, parsed.include_usage
            ):
                due = self.batch.due_s(round(share * total_tokens))
                if self.batch.gpu and due > time.perf_counter() - start:
                    await asyncio.sleep(due - (time.perf_counter() - start))
                await stream.write(protocol.sse(payload))
        self.batch.finished(len(prompt), total_tokens, received)
        await stream.write(protocol.SSE_DONE)
        await stream.write_eof()
        return stream
