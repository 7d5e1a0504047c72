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
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from aiohttp import web

from datagen_operator.engine.health import HEALTH_POLL_S, health_check_timeout_s
from datagen_operator.engine.limits import max_running_requests_per_rank, memory_cap, reserved_tokens
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.engine.reasoning import split_reasoning
from datagen_operator.engine.sim import chat, protocol, resolution
from datagen_operator.engine.sim.answers import AnswerWriter, json_response
from datagen_operator.engine.sim.batch import RunningBatch
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


@dataclass(frozen=True)
class Refusals:
    """How an endpoint words the refusals of the generation prologue (`Simulator._admitted`): /generate as
    SGLang's native API, the chat endpoint as OpenAI's."""

    not_ready: Callable[[], web.Response]
    bad_request: Callable[[RequestError], web.Response]
    server_error: Callable[[int, int], web.Response]
    """(the request's number, the status) of --sim-fault-5xx-rate."""


GENERATE_REFUSALS = Refusals(
    not_ready=lambda: web.Response(status=503),  # warming up or shutting down: an empty body, as /health
    bad_request=lambda error: json_response(error.body(), error.status),
    server_error=lambda number, status: json_response(
        {"error": {"message": f"Simulated server error (--sim-fault-5xx-rate), request {number}"}}, status
    ),
)
CHAT_REFUSALS = Refusals(
    not_ready=lambda: json_response(chat.openai_error("The server is not ready (loading or shutting down).", 503), 503),
    bad_request=lambda error: json_response(chat.openai_error(str(error)), 400),
    server_error=lambda _, status: json_response(
        chat.openai_error("Simulated server error (--sim-fault-5xx-rate)", status), status
    ),
)
Parsed = TypeVar("Parsed")


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
        self.batch = RunningBatch(settings.speed, sum(self.max_running_requests), self.metrics)
        self.answers = AnswerWriter(self.batch, settings.faults, self.args, vocab, self.model_name)
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
            self.batch.stalled_until = time.monotonic() + faults.stall_s
        return self.request_number, plan_faults(faults, self.request_number)

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
            if time.monotonic() >= self.batch.stalled_until:
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
        return json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.vocab.model_config
        return json_response(
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
        return json_response({"object": "list", "data": [entry]})

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
            return json_response({"error": {"message": "text must be a string."}}, 400)
        parser = body.get("reasoning_parser") or self.args["reasoning_parser"]
        split = split_reasoning(body["text"], parser, forced=False)
        return json_response({"text": split.content, "reasoning_text": split.reasoning or ""})

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
        if limit is None or self.batch.waiting + 1 <= limit:
            return None
        return protocol.queue_full_finish_reason()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        occupancy = self.occupancy
        if occupancy is None or not self.ready:
            return await self._generate(request)
        occupancy.arrived(time.monotonic())
        try:
            return await self._generate(request)
        finally:
            occupancy.left(time.monotonic())

    async def _admitted(
        self, request: web.Request, parse: Callable[[Any], Parsed], refusals: Refusals
    ) -> tuple[int, FaultPlan, Parsed] | web.Response:
        """Every generation request's prologue, in SGLang's order: refused while not ready; numbered (its fault
        plan, a stall it starts, a crash due after it); its body parsed (a bad one refused); a planned hang, then
        a planned server error. The request's number, plan and parsed body, or the refusal to answer with."""
        if not self.ready:
            return refusals.not_ready()
        number, plan = self._next_request()
        try:
            parsed = parse(await self._json_body(request))
        except RequestError as error:
            self._crash_if_due(number)
            return refusals.bad_request(error)
        if plan.hang_s:
            await asyncio.sleep(plan.hang_s)
        if plan.http_status:
            self._crash_if_due(number)
            return refusals.server_error(number, plan.http_status)
        return number, plan, parsed

    def _generate_request(self, body: Any) -> GenerateRequest:
        parsed = protocol.parse_generate_request(
            body,
            self.vocab,
            self.context_length,
            self.args["skip_tokenizer_init"],
            reserved_tokens=self.reserved_tokens,
        )
        return dataclasses.replace(parsed, items=self._memory_capped(parsed.items))

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        admitted = await self._admitted(request, self._generate_request, GENERATE_REFUSALS)
        if isinstance(admitted, web.Response):
            return admitted
        number, plan, parsed = admitted
        refusal = protocol.input_length_refusal(parsed, self.max_req_input_len)  # the scheduler's check
        if refusal is not None and not parsed.stream:
            return json_response(refusal.body(), refusal.status)
        shed = None if refusal is not None else self._shed_when_queue_full()
        answer = None if shed is None or parsed.stream else protocol.abort_response(shed)
        if answer is not None:
            return json_response(answer[1], answer[0])
        completions = [self._complete(item, plan) for item in parsed.items]
        aborted = shed if refusal is None else {"type": "abort", "message": str(refusal), "status_code": refusal.status}
        if aborted is not None:  # a stream carries the abort as its one result chunk, with no output
            completions = [Completion(c.run.prefix(0), aborted, "") for c in completions]
        # A refused or shed request never reaches the scheduler: nothing matched, nothing inserted.
        holds = [None if aborted is not None else self._admit(item) for item in parsed.items]
        cached = [0 if hold is None else hold.cached for hold in holds]
        try:
            if parsed.stream:
                response = await self.answers.stream(request, parsed, completions, cached, plan, received)
            else:
                response = await self.answers.whole(request, parsed, completions, cached, plan, received)
        finally:
            self._release(parsed.items, holds, completions)
        self._crash_if_due(number)
        return response

    # -- chat ------------------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        admitted = await self._admitted(request, self._chat_request, CHAT_REFUSALS)
        if isinstance(admitted, web.Response):
            return admitted
        number, plan, (parsed, generate) = admitted
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
            response = await self.answers.chat(request, parsed, prompt, items, completions, hold, received)
        finally:
            self._release(items[:1], [hold], completions[:1])
        self._crash_if_due(number)
        return response

    def _chat_request(self, body: Any) -> tuple[chat.ChatRequest, GenerateRequest]:
        """The chat request and its rendered prompt as a /generate request (the context's checks)."""
        parsed = chat.parse_chat_request(body, self.vocab)
        prompt_ids = chat.render_prompt(parsed, self.vocab)
        generate = protocol.parse_generate_request(
            {"input_ids": prompt_ids, "sampling_params": None},
            self.vocab,
            self.context_length,
            reserved_tokens=self.reserved_tokens,
        )
        return parsed, generate


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
        return json_response(error.body(), error.status)


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
