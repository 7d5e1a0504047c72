"""`datagen sim-server`: the imperative shell around the simulator's pure core (aiohttp on one event loop).

Speed: `--sim-speed wire` answers as fast as it can (benchmarks); `gpu` paces each request at
`--sim-tokens-per-s` after `--sim-ttft-s`, with at most `--max-running-requests` requests generating (as SGLang resolves it per DP rank) and
the rest queued (`sglang:num_queue_reqs`). Lifecycle, as SGLang: for the first half of `--sim-load-seconds`
the weights load and the port refuses connections (it is bound, so the port file names it); for the second
half the server warms up and `/health`, `/health_generate` and generation answer 503 with an empty body,
as they do while shutting down (SIGTERM/SIGINT); once up, a health call answers as SGLang's does (engine/health.py:
after a second at least, 503 when a `--sim-fault-stall-s` stall outlasts SGLANG_HEALTH_CHECK_TIMEOUT);
`--sim-crash-after-requests N` exits with status 1 right after answering the N-th generation request, dropping
whatever else is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import signal
import socket
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from datagen_operator.engine.health import HEALTH_POLL_S, health_check_timeout_s
from datagen_operator.engine.limits import max_running_requests_per_rank, memory_cap, reserved_tokens
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.engine.reasoning import split_reasoning
from datagen_operator.engine.sim import chat, protocol, resolution
from datagen_operator.engine.sim.config import SimSettings, parse_settings
from datagen_operator.engine.sim.faults import FaultPlan, plan_faults
from datagen_operator.engine.sim.model import Completion, aborted, complete, nan_guarded
from datagen_operator.engine.sim.occupancy import Occupancy
from datagen_operator.engine.sim.prefix_cache import Hold, RadixCache
from datagen_operator.engine.sim.protocol import GenerateItem, GenerateRequest, RequestError
from datagen_operator.engine.sim.vocab import SimVocab, VocabError, load_vocab
from datagen_operator.presets.sglang_names import (
    PINNED_SGLANG_VERSION,
    resolved_reasoning_parser,
    resolved_tool_call_parser,
)

if TYPE_CHECKING:
    from datagen_operator.engine.sim.metrics import SimMetrics

log = logging.getLogger("datagen.sim")

DEFAULT_CONTEXT_LENGTH = 262_144
SHUTDOWN_GRACE_S = 2.0
STREAM_WRITE_BYTES = 64 * 1024  # coalesce stream events into writes of about this size at wire speed
JSON = "application/json"


def _json(payload: Any, status: int = 200) -> web.Response:
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


class Simulator:
    def __init__(self, settings: SimSettings, vocab: SimVocab) -> None:
        self.settings = settings
        self.vocab = vocab
        self.args = settings.server_args
        self.model_name: str = self.args["served_model_name"]
        # `context_length` in args stays what the launch said (null unless --context-length), as SGLang reports it.
        self.context_length: int = self.args["context_length"] or int(
            vocab.model_config.get("max_position_embeddings") or DEFAULT_CONTEXT_LENGTH
        )
        self.started_at = time.time()
        self.ready_at = time.monotonic() + settings.speed.load_seconds
        self.stalled_until = 0.0
        self.health_check_timeout_s = health_check_timeout_s()
        self.shutting_down = False
        self.request_number = 0
        self.prefix_cache = (
            None if self.args["disable_radix_cache"] else RadixCache(self.kv_capacity, self.args["page_size"])
        )
        self.metrics: SimMetrics | None = None
        if self.args["enable_metrics"]:
            from datagen_operator.engine.sim.metrics import SimMetrics  # prometheus_client only when asked

            self.metrics = SimMetrics(self.model_name, self.context_length)
        self.occupancy: Occupancy | None = None
        if settings.speed.expected_in_flight:
            self.occupancy = Occupancy(settings.speed.expected_in_flight)
            if self.metrics is not None:
                self.metrics.occupancy = self.occupancy
        self.gpu = settings.speed.mode == "gpu"
        self.slots = asyncio.Semaphore(sum(self.max_running_requests))
        """The running batch: requests beyond every rank's max_running_requests wait (gpu speed)."""
        self.waiting = 0
        """Requests waiting for a batch slot: SGLang's waiting queue."""
        self.reserved_tokens = reserved_tokens(self.args)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return not self.shutting_down and time.monotonic() >= self.ready_at

    def _crash_if_due(self, number: int) -> None:
        limit = self.settings.faults.crash_after_requests
        if limit and number >= limit:
            print(
                f"sim-server: crashing after {number} generation requests (--sim-crash-after-requests)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    def _next_request(self) -> tuple[int, FaultPlan]:
        self.request_number += 1
        faults = self.settings.faults
        if faults.stall_s and self.request_number == max(1, faults.stall_after_requests):
            self.stalled_until = time.monotonic() + faults.stall_s
        return self.request_number, plan_faults(faults, self.request_number)

    async def _through_stall(self) -> None:
        """Hold an answer while the scheduler is stalled (--sim-fault-stall-s)."""
        rest = self.stalled_until - time.monotonic()  # one stall per server: it never moves once set
        if rest > 0:
            await asyncio.sleep(rest)

    # -- info endpoints --------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """As SGLang's `health_generate` (engine/health.py): 503 at once while starting or shutting down;
        else a one-token generation, looked at every second, the first time after a second: 200 once the
        scheduler has run it, 503 when it has not within the health timeout."""
        if not self.ready:
            return web.Response(status=503)
        started = time.monotonic()
        while time.monotonic() < started + self.health_check_timeout_s:
            await asyncio.sleep(HEALTH_POLL_S)
            if time.monotonic() >= self.stalled_until:
                return web.Response(status=200)
        return web.Response(status=503)

    @property
    def _server_key(self) -> str:
        return f"{self.args['port']}:{self.args.get('sim_seed', 0)}"

    @property
    def rank_capacities(self) -> list[int]:
        """Each DP rank's KV capacity, measured from "free GPU memory" at start-up: differs per replica, server
        (port) and seed."""
        args = self.args
        if args.get("sim_kv_capacity"):
            return [int(args["sim_kv_capacity"])] * (args["dp_size"] * args["attn_dp_size"])
        return protocol.dp_rank_capacities(self.context_length, self._server_key, args["dp_size"], args["attn_dp_size"])

    @property
    def max_running_requests(self) -> list[int]:
        """Each DP rank's running-request limit, as SGLang's pool configuration resolves it from the launch's
        --max-running-requests and the rank's token pool."""
        requested, attn_dp = self.args.get("max_running_requests"), int(self.args["attn_dp_size"])
        return [
            max_running_requests_per_rank(capacity, self.context_length, requested, attn_dp)
            for capacity in self.rank_capacities
        ]

    def _memory_capped(self, items: list[GenerateItem]) -> list[GenerateItem]:
        """Each item's max_new_tokens also capped to what the KV pool holds beside its prompt, after the context's
        cap (`Scheduler.init_req_max_new_tokens`; engine.limits.memory_cap). Binds only with --sim-kv-capacity:
        the measured pool holds several contexts."""
        capacity, page = self.kv_capacity, int(self.args.get("page_size") or 1)
        return [
            dataclasses.replace(item, max_new_tokens=memory_cap(len(item.prompt), item.max_new_tokens, capacity, page))
            for item in items
        ]

    @property
    def kv_capacity(self) -> int:
        """The one DP rank's capacity `/server_info` reports."""
        order = protocol.loading_order(self._server_key, self.args["dp_size"])
        return protocol.reported_capacity(self.rank_capacities, order, self.args["attn_dp_size"])

    @property
    def max_req_input_len(self) -> int:
        # Every rank's: the simulated KV pool (several contexts) never binds, so the context does.
        return protocol.max_req_input_len(self.context_length, self.kv_capacity)

    async def server_info(self, request: web.Request) -> web.Response:
        info = {
            **self.args,
            # Parser names as SGLang's argument resolution leaves them (qwen25 -> qwen, glm45 -> glm).
            "reasoning_parser": resolved_reasoning_parser(self.args["reasoning_parser"]),
            "tool_call_parser": resolved_tool_call_parser(self.args["tool_call_parser"]),
            "version": PINNED_SGLANG_VERSION,
            "startup_time": self.started_at,
            "max_total_num_tokens": self.kv_capacity,
            "max_req_input_len": self.max_req_input_len,
            # One per DP rank (`get_internal_state` fans out to every rank).
            "internal_states": [
                {
                    "effective_max_running_requests_per_dp": running,
                    "last_gen_throughput": 0.0,
                    "memory_usage": {"token_capacity": capacity},
                }
                for capacity, running in zip(self.rank_capacities, self.max_running_requests, strict=True)
            ],
        }
        return _json(info)

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.vocab.model_config
        return _json(
            {
                "model_path": self.args["model_path"],
                "tokenizer_path": self.args["tokenizer_path"],
                "served_model_name": self.model_name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": protocol.WEIGHT_VERSION,
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": config.get("model_type"),
                "architectures": config.get("architectures"),
                "reasoning_parser": self.args["reasoning_parser"],
                "tool_call_parser": self.args["tool_call_parser"],
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        entry = {
            "id": self.model_name,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": "sglang",
            "root": self.model_name,
            "max_model_len": self.context_length,
        }
        return _json({"object": "list", "data": [entry]})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise web.HTTPNotFound()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.prefix_cache is not None:
            self.prefix_cache.flush()
        return web.Response(text="Cache flushed.\n")

    async def separate_reasoning(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return _json({"error": {"message": "text must be a string."}}, 400)
        parser = body.get("reasoning_parser") or self.args["reasoning_parser"]
        split = split_reasoning(body["text"], parser, forced=False)
        return _json({"text": split.content, "reasoning_text": split.reasoning or ""})

    @staticmethod
    async def _json_body(request: web.Request) -> Any:
        try:
            return orjson.loads(await request.read())
        except orjson.JSONDecodeError as error:
            raise RequestError(f"Invalid JSON body: {error}") from None

    # -- generation ------------------------------------------------------------------------------
    def _complete(self, item: GenerateItem, plan: FaultPlan) -> Completion:
        completion = complete(item.prompt, item.params, self.settings.model, self.vocab, item.max_new_tokens)
        if plan.abort:
            completion = aborted(completion, "Simulated abort (--sim-fault-abort-rate)", 500)
        elif plan.nan:
            completion = nan_guarded(completion, item.params.stop_token_ids, self.vocab)
        return completion

    def _admit(self, item: GenerateItem) -> Hold | None:
        """The request's prefix matched (and locked) in the radix cache; `.cached` is its `cached_tokens`."""
        return self.prefix_cache.admit(item.prompt) if self.prefix_cache is not None else None

    def _release(self, items: list[GenerateItem], holds: list[Hold | None], completions: list[Completion]) -> None:
        """Finished: each prompt and its output go into the radix cache (SGLang's `release_kv_cache`)."""
        if self.prefix_cache is None:
            return
        for item, hold, completion in zip(items, holds, completions, strict=True):
            if hold is not None:
                output = array("I")
                for span in completion.run.spans:  # from the sources' bytes: no int per token
                    output.frombytes(span.source.id_bytes[4 * span.start : 4 * span.stop])
                self.prefix_cache.finish(hold, item.prompt, output)

    def _shed_when_queue_full(self) -> dict[str, Any] | None:
        """--max-queued-requests: SGLang's scheduler aborts an arriving request when its waiting queue is full
        (scheduler.py `_abort_on_queued_limit`, without priority scheduling), with this finish_reason."""
        limit = self.args.get("max_queued_requests")
        if limit is None or self.waiting + 1 <= limit:
            return None
        return protocol.queue_full_finish_reason()

    @contextlib.asynccontextmanager
    async def _generating(self, prompt_tokens: int, cached_tokens: int) -> AsyncIterator[None]:
        """Hold a batch slot (gpu speed: queue when full) and keep the running/queue gauges right even when
        the client disconnects (which cancels the handler)."""
        metrics = self.metrics
        if self.gpu:
            if metrics is not None:
                metrics.queued.inc()
            self.waiting += 1
            try:
                await self.slots.acquire()
            finally:
                self.waiting -= 1
                if metrics is not None:
                    metrics.queued.dec()
        if metrics is not None:
            metrics.started(prompt_tokens, cached_tokens)
        try:
            yield
        finally:
            if metrics is not None:
                metrics.stopped(prompt_tokens)
            if self.gpu:
                self.slots.release()

    def _finished(self, prompt_tokens: int, completion_tokens: int, received: float) -> None:
        if self.metrics is not None:
            e2e = time.perf_counter() - received
            ttft = min(e2e, self.settings.speed.ttft_s) if self.gpu else e2e
            self.metrics.finished(prompt_tokens, completion_tokens, ttft, e2e)

    async def _run_item(self, item: GenerateItem, completion: Completion, cached: int, received: float) -> None:
        async with self._generating(len(item.prompt), cached):
            if self.gpu:
                speed = self.settings.speed
                await asyncio.sleep(speed.ttft_s + len(completion.run) / speed.tokens_per_s)
            await self._through_stall()
        self._finished(len(item.prompt), len(completion.run), received)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        occupancy = self.occupancy
        if occupancy is None or not self.ready:
            return await self._generate(request)
        occupancy.arrived(time.monotonic())
        try:
            return await self._generate(request)
        finally:
            occupancy.left(time.monotonic())

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        if not self.ready:
            return web.Response(status=503)  # warming up or shutting down: an empty body, as /health
        number, plan = self._next_request()
        try:
            parsed = protocol.parse_generate_request(
                await self._json_body(request),
                self.vocab,
                self.context_length,
                self.args["skip_tokenizer_init"],
                reserved_tokens=self.reserved_tokens,
            )
            parsed = dataclasses.replace(parsed, items=self._memory_capped(parsed.items))
        except RequestError as error:
            self._crash_if_due(number)
            return _json(error.body(), error.status)
        if plan.hang_s:
            await asyncio.sleep(plan.hang_s)
        if plan.http_status:
            self._crash_if_due(number)
            message = f"Simulated server error (--sim-fault-5xx-rate), request {number}"
            return _json({"error": {"message": message}}, plan.http_status)
        refusal = protocol.input_length_refusal(parsed, self.max_req_input_len)  # the scheduler's check
        if refusal is not None and not parsed.stream:
            return _json(refusal.body(), refusal.status)
        shed = None if refusal is not None else self._shed_when_queue_full()
        answer = None if shed is None or parsed.stream else protocol.abort_response(shed)
        if answer is not None:
            return _json(answer[1], answer[0])
        completions = [self._complete(item, plan) for item in parsed.items]
        aborted = shed if refusal is None else {"type": "abort", "message": str(refusal), "status_code": refusal.status}
        if aborted is not None:  # a stream carries the abort as its one result chunk, with no output
            completions = [Completion(c.run.prefix(0), aborted, "") for c in completions]
        # A refused or shed request never reaches the scheduler: nothing matched, nothing inserted.
        holds = [None if aborted is not None else self._admit(item) for item in parsed.items]
        cached = [0 if hold is None else hold.cached for hold in holds]
        try:
            if parsed.stream:
                response = await self._stream_generate(request, parsed, completions, cached, plan, received)
            else:
                response = await self._generate_once(request, parsed, completions, cached, plan, received)
        finally:
            self._release(parsed.items, holds, completions)
        self._crash_if_due(number)
        return response

    async def _generate_once(
        self,
        request: web.Request,
        parsed: GenerateRequest,
        completions: list[Completion],
        cached: list[int],
        plan: FaultPlan,
        received: float,
    ) -> web.StreamResponse:
        await self._through_stall()
        if self.gpu or self.metrics is not None:
            await asyncio.gather(
                *(
                    self._run_item(item, c, k, received)
                    for item, c, k in zip(parsed.items, completions, cached, strict=True)
                )
            )
        for completion in completions:  # a scheduler abort with an HTTP status fails the whole request
            abort = protocol.abort_response(completion.finish_reason)
            if abort is not None:
                return _json(abort[1], abort[0])
        leak = self.settings.faults.prompt_suffix_leak
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
        if plan.reset or self.settings.faults.crash_after_requests:
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

    async def _stream_generate(
        self,
        request: web.Request,
        parsed: GenerateRequest,
        completions: list[Completion],
        cached: list[int],
        plan: FaultPlan,
        received: float,
    ) -> web.StreamResponse:
        leak = self.settings.faults.prompt_suffix_leak
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
            streams.append((self._due_s(event.tokens), item.index, event) for event in events)
        # Generated lazily (a cumulative stream of a long answer is O(n^2) bytes); a batch interleaves
        # its requests' events by due time at gpu speed.
        merged = heapq.merge(*streams, key=lambda entry: entry[0]) if self.gpu else itertools.chain(*streams)
        cut = total_events // 2 if plan.reset or plan.stream_error else None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        async with contextlib.AsyncExitStack() as stack:
            for item, completion, cached_tokens in zip(parsed.items, completions, cached, strict=True):
                if protocol.abort_response(completion.finish_reason) is None:  # a refused request never queues
                    await stack.enter_async_context(self._generating(len(item.prompt), cached_tokens))
            buffer = bytearray()
            start = time.perf_counter()
            for position, (due, _, event) in enumerate(merged):
                if position == cut:
                    break
                if self.stalled_until > time.monotonic():
                    if buffer:
                        await response.write(bytes(buffer))
                        buffer.clear()
                    stalled = time.monotonic()
                    await self._through_stall()
                    start += time.monotonic() - stalled  # no token was made meanwhile
                if self.gpu and due > time.perf_counter() - start:
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
            self._finished(len(item.prompt), len(completion.run), received)
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

    def _due_s(self, tokens: int) -> float:
        if not self.gpu:
            return 0.0
        speed = self.settings.speed
        return speed.ttft_s + tokens / speed.tokens_per_s if tokens else speed.ttft_s

    # -- chat ------------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        if not self.ready:
            return _json(chat.openai_error("The server is not ready (loading or shutting down).", 503), 503)
        number, plan = self._next_request()
        try:
            parsed = chat.parse_chat_request(await self._json_body(request), self.vocab)
            prompt_ids = chat.render_prompt(parsed, self.vocab)
            generate = protocol.parse_generate_request(
                {"input_ids": prompt_ids, "sampling_params": None},
                self.vocab,
                self.context_length,
                reserved_tokens=self.reserved_tokens,
            )
        except RequestError as error:
            self._crash_if_due(number)
            return _json(chat.openai_error(str(error)), 400)
        if plan.hang_s:
            await asyncio.sleep(plan.hang_s)
        if plan.http_status:
            self._crash_if_due(number)
            return _json(
                chat.openai_error("Simulated server error (--sim-fault-5xx-rate)", plan.http_status), plan.http_status
            )
        prompt = generate.items[0].prompt
        max_new = protocol.scheduler_max_new_tokens(len(prompt), parsed.params.max_new_tokens, self.context_length)
        items = self._memory_capped(
            [
                GenerateItem(prompt, parsed.params, protocol.new_rid(), sample, max_new, sample)
                for sample in range(parsed.params.n)
            ]
        )
        completions = [self._complete(item, plan) for item in items]
        hold = self._admit(items[0])
        try:
            return await self._chat_answer(request, parsed, prompt, items, completions, hold, number, received)
        finally:
            self._release(items[:1], [hold], completions[:1])

    async def _chat_answer(
        self,
        request: web.Request,
        parsed: chat.ChatRequest,
        prompt: array[int],
        items: list[GenerateItem],
        completions: list[Completion],
        hold: Hold | None,
        number: int,
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
                *(self._run_item(i, c, cached, received) for i, c in zip(items, completions, strict=True))
            )
            response = _json(chat.chat_response(response_id, created, model, len(prompt), choices))
            self._crash_if_due(number)
            return response
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        total_tokens = max(len(c.run) for c in completions)
        async with self._generating(len(prompt), cached):
            start = time.perf_counter()
            for share, payload in chat.chat_stream_chunks(
                response_id, created, model, len(prompt), choices, parsed.include_usage
            ):
                due = self._due_s(round(share * total_tokens))
                if self.gpu and due > time.perf_counter() - start:
                    await asyncio.sleep(due - (time.perf_counter() - start))
                await stream.write(protocol.sse(payload))
        self._finished(len(prompt), total_tokens, received)
        await stream.write(protocol.SSE_DONE)
        await stream.write_eof()
        self._crash_if_due(number)
        return stream


def build_app(sim: Simulator) -> web.Application:
    app = web.Application(client_max_size=1024**3, middlewares=[_request_errors])
    app.router.add_get("/health", sim.health)
    app.router.add_get("/health_generate", sim.health)
    app.router.add_get("/server_info", sim.server_info)
    app.router.add_get("/get_server_info", sim.server_info)
    app.router.add_get("/model_info", sim.model_info)
    app.router.add_get("/get_model_info", sim.model_info)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/metrics", sim.metrics_endpoint)
    app.router.add_post("/generate", sim.generate)
    app.router.add_post("/v1/chat/completions", sim.chat_completions)
    app.router.add_post("/flush_cache", sim.flush_cache)
    app.router.add_post("/separate_reasoning", sim.separate_reasoning)
    return app


@web.middleware
async def _request_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as error:
        return _json(error.body(), error.status)


def _resolve_tokenizer_dir(settings: SimSettings) -> Path:
    from datagen_operator.tokenizer.standin import DEFAULT_FAMILY, ensure_standin_tokenizer

    directory = settings.tokenizer_dir
    family = settings.family or DEFAULT_FAMILY
    if directory is None:
        return ensure_standin_tokenizer(family=family)
    has_tokenizer = (directory / "tokenizer.json").is_file() or (directory / "tokenizer_config.json").is_file()
    if not has_tokenizer and settings.fallback_standin:
        log.warning("%s has no tokenizer; using the %s stand-in tokenizer (--sim-fallback-standin)", directory, family)
        return ensure_standin_tokenizer(family=family)
    return directory


def _bind(host: str, port: int) -> socket.socket:
    """Bound, not yet listening: connections are refused until `listen()`, as while SGLang loads weights."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


async def serve(settings: SimSettings, vocab: SimVocab) -> int:
    sim = Simulator(settings, vocab)
    runner = web.AppRunner(
        build_app(sim),
        access_log=log if log.isEnabledFor(logging.DEBUG) else None,
        handle_signals=False,
        handler_cancellation=True,  # a client that disconnects aborts its request, as in SGLang
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    sim.args["port"] = port
    if settings.port_file is not None:
        staging = settings.port_file.with_name(settings.port_file.name + ".tmp")
        staging.write_text(f"{port}\n")
        staging.replace(settings.port_file)
    await asyncio.sleep(settings.speed.load_seconds / 2)  # loading weights: the port refuses connections
    sock.listen(1024)
    await web.SockSite(runner, sock).start()  # warming up until sim.ready_at: 503s
    print(f"sim-server: listening on http://{settings.host}:{port} (SGLang {PINNED_SGLANG_VERSION} API)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    sim.shutting_down = True  # /health answers 503 while in-flight requests finish
    await runner.cleanup()
    return 0


def main(argv: list[str]) -> int:
    try:
        settings = parse_settings(argv)  # exits 2 on bad flags, like sglang.launch_server
    except resolution.LaunchError as error:  # SGLang's resolution raises: the launch fails with status 1
        print(f"sim-server: {error}", file=sys.stderr)
        return 1
    level = logging.getLevelName(str(settings.server_args["log_level"]).upper())
    logging.basicConfig(
        level=level if isinstance(level, int) else logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        tokenizer_dir = _resolve_tokenizer_dir(settings)
        chat_template = settings.server_args["chat_template"]
        model_path = settings.server_args["model_path"]
        vocab = load_vocab(
            tokenizer_dir,
            Path(chat_template) if chat_template and Path(chat_template).is_file() else None,
            settings.family,
            # SGLang reads the model's configs from --model-path, the tokenizer from --tokenizer-path.
            model_dir=model_config_dir(model_path, None) if model_path else None,
        )
        settings.server_args.update(resolution.model_resolved(settings.server_args, vocab.model_config))
    except (VocabError, OSError, resolution.LaunchError) as error:
        print(f"sim-server: {error}", file=sys.stderr)
        return 1
    args = settings.server_args
    args["model_path"] = args["model_path"] or str(tokenizer_dir)
    args["tokenizer_path"] = args["tokenizer_path"] or str(tokenizer_dir)
    args["served_model_name"] = args["served_model_name"] or args["model_path"]
    return asyncio.run(serve(settings, vocab))
