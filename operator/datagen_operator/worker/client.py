"""The /generate HTTP client: retries, pauses while servers are down, spreads over endpoints, streams deltas.

Failure policy (pure, in `classify_status` and `backoff_delay`):
- 2xx: done. A 200 whose finish_reason is `abort` is classified by its status_code like an HTTP answer.
- 503 or connection refused: the server is down or restarting. The endpoint is taken out of rotation and
  probed (GET /health) until it answers 200; requests wait for any endpoint, without spending attempts.
  Only if every endpoint stays down past `unreachable_after_s` does the worker give up (exit code 4).
- Other 5xx, 408, 429, connection resets, timeouts, retryable mid-stream errors: retried with capped
  exponential backoff and full jitter, at most `max_attempts` tries. A reset on an endpoint that a probe
  then finds down counts as an outage, not an attempt.
- Other 4xx (400: bad sampling params, prompt too long): permanent; the record goes to rejects.jsonl.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from datagen_operator.engine import wire

log = logging.getLogger("datagen.worker.client")


# --- pure decisions --------------------------------------------------------------------------------


class Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    DOWN = "down"
    REJECT = "reject"


def classify_status(status: int) -> Verdict:
    if 200 <= status < 300:
        return Verdict.OK
    if status == 503:
        return Verdict.DOWN
    if status in (408, 429) or status >= 500:
        return Verdict.RETRY
    if 400 <= status < 500:
        return Verdict.REJECT
    return Verdict.RETRY


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 30.0


def backoff_delay(attempt: int, policy: RetryPolicy, unit: float) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))); `unit` is a uniform [0, 1) draw."""
    return unit * min(policy.cap_s, policy.base_s * 2 ** max(0, attempt - 1))


def error_reason(body: bytes, limit: int = 500) -> str:
    """SGLang's error text: `{"error": "..."}` (sampling validation) or `{"error": {"message": ...}}`."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:limit].decode("utf-8", errors="replace").strip() or "(empty body)"
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict):
        error = error.get("message") or error
    if error is None and isinstance(obj, dict):
        error = obj.get("message") or obj.get("detail") or obj
    text = error if isinstance(error, str) else orjson.dumps(error).decode()
    return text[:limit]


def abort_verdict(finish_reason: Any) -> tuple[Verdict, str] | None:
    """A 200 answer the server aborted: classified by the status_code it carries (None if not aborted)."""
    if not isinstance(finish_reason, dict) or finish_reason.get("type") != "abort":
        return None
    status = finish_reason.get("status_code")
    message = str(finish_reason.get("message") or "aborted by the server")
    verdict = classify_status(status) if isinstance(status, int) else Verdict.RETRY
    if verdict is Verdict.OK:
        verdict = Verdict.RETRY
    return verdict, f"aborted: {message}"


class RequestFailed(Exception):
    def __init__(self, verdict: Verdict, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.verdict = verdict
        self.reason = reason
        self.status = status


class Rejected(Exception):
    """Permanent: the server refused this request (400...)."""

    def __init__(self, status: int | None, reason: str, server: str, attempts: int) -> None:
        super().__init__(reason)
        self.status, self.reason, self.server, self.attempts = status, reason, server, attempts


class GaveUp(Exception):
    """Retryable errors on every one of max_attempts tries; the record is left for the next run."""

    def __init__(self, reason: str, attempts: int) -> None:
        super().__init__(reason)
        self.reason, self.attempts = reason, attempts


class Drained(Exception):
    """Shutdown was requested while this request was waiting (backoff or a server outage)."""


class ServerUnreachable(Exception):
    """Every endpoint stayed down past the deadline."""


class EndpointsRejected(Exception):
    """Every endpoint serves something other than this run's fingerprint."""


# --- endpoints -------------------------------------------------------------------------------------


@dataclass
class Endpoint:
    url: str
    up: bool = True
    in_flight: int = 0
    served: int = 0
    disabled: str | None = None
    """Why this endpoint is permanently out of rotation (its /server_info differs from the run's)."""
    probe: asyncio.Task[None] | None = None
    generate_url: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        from yarl import URL

        self.generate_url = URL(self.url + "/generate")  # parsed once, not per request


Verifier = Callable[[Endpoint], Awaitable[str | None]]
"""Checks an endpoint that (re)appeared; returns why it must not be used, or None."""


class EndpointPool:
    """The servers of a run. Picks the up endpoint with fewest requests in flight; pauses when none is up."""

    def __init__(
        self,
        urls: list[str],
        session: aiohttp.ClientSession,
        *,
        unreachable_after_s: float,
        probe_interval_s: float = 1.0,
        verify: Verifier | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.session = session
        self.unreachable_after_s = unreachable_after_s
        self.probe_interval_s = probe_interval_s
        self.verify = verify
        self.stop = stop or asyncio.Event()
        self._changed = asyncio.Event()
        self._all_down_since: float | None = None
        self._turn = 0
        self.outages = 0

    @property
    def in_flight(self) -> int:
        return sum(e.in_flight for e in self.endpoints)

    @property
    def any_up(self) -> bool:
        return any(e.up and e.disabled is None for e in self.endpoints)

    def down_for_s(self) -> float:
        return 0.0 if self._all_down_since is None else time.monotonic() - self._all_down_since

    def pick(self) -> Endpoint | None:
        if len(self.endpoints) == 1:  # the common case, on every request
            only = self.endpoints[0]
            return only if only.up and only.disabled is None else None
        candidates = [e for e in self.endpoints if e.up and e.disabled is None]
        if not candidates:
            return None
        self._turn += 1
        # Fewest in flight; ties rotate so one endpoint does not take every idle slot first.
        n = len(candidates)
        return min(
            (candidates[(self._turn + i) % n] for i in range(n)),
            key=lambda e: e.in_flight,
        )

    async def acquire(self) -> Endpoint:
        while True:
            if self.stop.is_set():
                raise Drained()
            endpoint = self.pick()
            if endpoint is not None:
                endpoint.in_flight += 1
                return endpoint
            if all(e.disabled for e in self.endpoints):
                raise EndpointsRejected("; ".join(f"{e.url}: {e.disabled}" for e in self.endpoints))
            down = self.down_for_s()
            if down >= self.unreachable_after_s:
                raise ServerUnreachable(
                    f"no server answered for {down:.0f}s (deadline {self.unreachable_after_s:.0f}s): "
                    + ", ".join(e.url for e in self.endpoints)
                )
            self._changed.clear()
            waits = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(self.stop.wait())]
            timeout = min(1.0, self.unreachable_after_s - down)
            _, pending = await asyncio.wait(waits, timeout=max(timeout, 0.01), return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    def release(self, endpoint: Endpoint) -> None:
        endpoint.in_flight -= 1

    def mark_down(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.up:
            endpoint.up = False
            self.outages += 1
            log.warning("server %s is down (%s); pausing its requests until /health answers", endpoint.url, reason)
            if not self.any_up and self._all_down_since is None:
                self._all_down_since = time.monotonic()
        if endpoint.probe is None or endpoint.probe.done():
            endpoint.probe = asyncio.create_task(self._probe_until_up(endpoint))

    def _mark_up(self, endpoint: Endpoint) -> None:
        if not endpoint.up:
            log.warning("server %s is back", endpoint.url)
        endpoint.up = True
        self._all_down_since = None
        self._changed.set()

    async def health(self, endpoint: Endpoint, timeout_s: float = 30.0) -> bool:
        """GET /health: 200 is healthy. The body is empty in SGLang; never look for 'ok' in it."""
        try:
            async with self.session.get(
                endpoint.url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def check(self, endpoint: Endpoint) -> bool:
        """After a reset: is the endpoint still there? If not, it is marked down (the outage is not the
        request's fault)."""
        if await self.health(endpoint, timeout_s=10.0):
            return True
        self.mark_down(endpoint, "health check failed after a connection error")
        return False

    async def _probe_until_up(self, endpoint: Endpoint) -> None:
        delay = self.probe_interval_s
        while not self.stop.is_set():
            # Wait first: a server that answers /health but 503s /generate must not be hammered in a loop.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
            delay = min(delay * 1.5, 5.0)
            if self.stop.is_set():
                return
            if await self.health(endpoint):
                problem = await self.verify(endpoint) if self.verify else None
                if problem:
                    endpoint.disabled = problem
                    log.error("server %s is not usable for this run: %s", endpoint.url, problem)
                    self._changed.set()
                    return
                self._mark_up(endpoint)
                return

    async def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.probe is not None:
                endpoint.probe.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await endpoint.probe


# --- /generate -------------------------------------------------------------------------------------

OUTAGES_PER_ATTEMPT = 10

# Errors that mean the server process is not there (as opposed to a request that went wrong).
_REFUSED = (aiohttp.ClientConnectorError,)
_RESET = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError)


@dataclass
class Reply:
    output_ids: Sequence[int]
    """Usually a `wire.WireIds` (the server's bytes, never parsed into ints); a list when the answer was not
    in the compact form."""
    meta_info: dict[str, Any]
    server: str
    attempts: int
    latency_s: float
    output_ids_json: bytes | None = None
    """`output_ids` as the server encoded them, to store without re-encoding."""


class GenerateClient:
    def __init__(
        self,
        pool: EndpointPool,
        *,
        policy: RetryPolicy,
        request_timeout_s: float,
        stream: bool = False,
        rng: random.Random | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.stream = stream
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=30.0)
        self.rng = rng or random.Random()
        self.on_retry = on_retry or (lambda kind: None)

    async def generate(self, payload: bytes) -> Reply:
        """POST the payload until it succeeds, is rejected, or runs out of attempts."""
        attempts = 0  # tries that count against max_attempts
        tries = 0  # every request sent (what the record reports)
        outages = 0
        while True:
            endpoint = await self.pool.acquire()
            tries += 1
            started = time.monotonic()
            try:
                output_ids, meta, raw = await self._post(endpoint, payload)
                endpoint.served += 1
                return Reply(output_ids, meta, endpoint.url, tries, time.monotonic() - started, raw)
            except RequestFailed as failure:
                verdict, reason, status = failure.verdict, failure.reason, failure.status
            except _REFUSED as error:
                verdict, reason, status = Verdict.DOWN, f"connection refused: {error}", None
            except _RESET as error:
                verdict, reason, status = Verdict.RETRY, f"connection error: {type(error).__name__}: {error}", None
                # A crashing server resets its connections first: if it is gone, this is an outage.
                if not await self.pool.check(endpoint):
                    verdict = Verdict.DOWN
            except TimeoutError:
                verdict, reason, status = Verdict.RETRY, f"timed out after {self.timeout.total:.0f}s", None
            finally:
                self.pool.release(endpoint)

            if verdict is Verdict.REJECT:
                raise Rejected(status, reason, endpoint.url, tries)
            if verdict is Verdict.DOWN:
                self.on_retry("server_down")
                self.pool.mark_down(endpoint, reason)
                outages += 1
                # An outage is free, but a server whose /health is fine while /generate keeps answering 503
                # would loop forever: every OUTAGES_PER_ATTEMPT-th outage of one request costs an attempt.
                if outages % OUTAGES_PER_ATTEMPT:
                    continue
            attempts += 1
            self.on_retry(_retry_kind(status, reason))
            if attempts >= self.policy.max_attempts:
                raise GaveUp(f"{reason} (after {attempts} attempts)", tries)
            delay = backoff_delay(attempts, self.policy, self.rng.random())
            log.debug("retrying after %.2fs: %s", delay, reason)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pool.stop.wait(), delay)
            if self.pool.stop.is_set():
                raise Drained()

    async def _post(self, endpoint: Endpoint, payload: bytes) -> tuple[Sequence[int], dict[str, Any], bytes | None]:
        async with self.pool.session.post(
            endpoint.generate_url,
            data=payload,
            headers={"Content-Type": "application/json"},
            timeout=self.timeout,
        ) as response:
            if response.status != 200:
                body = await response.read()
                raise RequestFailed(classify_status(response.status), error_reason(body), response.status)
            raw: bytes | None = None
            if self.stream:
                output_ids, meta = await read_incremental_stream(response.content)
                raw = output_ids.raw if isinstance(output_ids, wire.WireIds) else None
            else:
                output_ids, meta, raw = parse_generate_body(await response.read())
        aborted = abort_verdict(meta.get("finish_reason"))
        if aborted is not None:
            raise RequestFailed(aborted[0], aborted[1], meta["finish_reason"].get("status_code"))
        return output_ids, meta, raw


def _retry_kind(status: int | None, reason: str) -> str:
    if reason.startswith("aborted"):
        return "aborted"
    if status is not None:
        return f"http_{status}"
    if reason.startswith("timed out"):
        return "timeout"
    if reason.startswith("stream"):
        return "stream_error"
    return "connection_error"


def parse_generate_body(body: bytes) -> tuple[Sequence[int], dict[str, Any], bytes | None]:
    """(output_ids, meta_info, the JSON text of output_ids as sent, or None if it cannot be cut out).

    The answer's ids stay bytes (`wire.split_answer`) when they are in orjson's compact form, as SGLang
    sends them; otherwise the whole body is parsed."""
    split = wire.split_answer(body)
    if split is not None:
        ids, obj = split
        meta = obj.get("meta_info")
        return ids, meta if isinstance(meta, dict) else {}, ids.raw
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RequestFailed(Verdict.RETRY, f"response is not JSON: {error}") from None
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    if not isinstance(obj, dict) or not isinstance(obj.get("output_ids"), list):
        raise RequestFailed(Verdict.RETRY, "response has no output_ids list")
    meta = obj.get("meta_info")
    ids = obj["output_ids"]
    return ids, meta if isinstance(meta, dict) else {}, int_array_text(body, ids)


_OUTPUT_IDS_KEY = b'"output_ids"'


def _skip_space(data: bytes, at: int) -> int:
    while data[at : at + 1] in (b" ", b"\n", b"\r", b"\t"):
        at += 1
    return at


def int_array_text(body: bytes, ids: list[int]) -> bytes | None:
    """The bytes of the `output_ids` array in `body`, verified against the parsed `ids`.

    Storing these bytes as they came saves re-encoding thousands of ints per record. A quote cannot
    appear unescaped inside a JSON string, so the key found is a real key (SGLang's answer has no other
    `output_ids`); the slice (up to the first `]`) must also start and end with the parsed ids' first
    and last element. Counting its commas would cost as much as re-encoding.
    """
    at = body.find(_OUTPUT_IDS_KEY)
    if at < 0:
        return None
    start = _skip_space(body, at + len(_OUTPUT_IDS_KEY))
    if body[start : start + 1] != b":":
        return None
    start = _skip_space(body, start + 1)
    end = body.find(b"]", start)
    if body[start : start + 1] != b"[" or end < 0:
        return None
    raw = body[start : end + 1]
    if not ids:
        return raw if not raw[1:-1].strip() else None
    if len(raw) < 2 * len(ids) + 1:  # each element needs a digit and a separator
        return None
    first_end = raw.find(b",") if len(ids) > 1 else len(raw) - 1
    last_start = raw.rfind(b",") + 1 if len(ids) > 1 else 1
    try:
        if int(raw[1:first_end]) != ids[0] or int(raw[last_start:-1]) != ids[-1]:
            return None
    except ValueError:
        return None
    return raw


async def read_incremental_stream(content: aiohttp.StreamReader) -> tuple[wire.WireIds, dict[str, Any]]:
    """SSE `data: {...}` chunks with DISJOINT output_ids deltas (--incremental-streaming-output), joined.

    Work is per chunk, never per token, and never re-reads earlier tokens; each delta stays bytes when it
    can (`wire.cut_array`) and the deltas are joined as bytes. The last chunk's meta_info
    (finish_reason, completion_tokens) describes the whole answer.
    """
    output_ids: list[Sequence[int]] = []
    meta: dict[str, Any] = {}
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n\n", start)) != -1:
            event = bytes(buffer[start:end])
            start = end + 2
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return _finished(output_ids, meta)
                cut = wire.cut_array(data)
                try:
                    obj = orjson.loads(data if cut is None else cut[2])
                except orjson.JSONDecodeError as error:
                    raise RequestFailed(Verdict.RETRY, f"stream chunk is not JSON: {error}") from None
                if not isinstance(obj, dict):
                    raise RequestFailed(Verdict.RETRY, "stream chunk is not a JSON object")
                error_body = obj.get("error")
                if error_body is not None:
                    retryable = not isinstance(error_body, dict) or error_body.get("retryable", True)
                    message = error_body.get("message") if isinstance(error_body, dict) else str(error_body)
                    verdict = Verdict.RETRY if retryable else Verdict.REJECT
                    raise RequestFailed(verdict, f"stream error: {message}")
                ids = obj.get("output_ids")
                if cut is not None and ids == []:  # the delta cut out was the real key's
                    output_ids.append(wire.WireIds(cut[0], cut[1]))
                elif ids:
                    output_ids.append(ids)
                chunk_meta = obj.get("meta_info")
                if isinstance(chunk_meta, dict):
                    meta = chunk_meta
        del buffer[:start]
    return _finished(output_ids, meta)


def _finished(output_ids: list[Sequence[int]], meta: dict[str, Any]) -> tuple[wire.WireIds, dict[str, Any]]:
    if meta.get("finish_reason") is None:
        raise RequestFailed(Verdict.RETRY, "stream ended before the answer finished")
    return wire.join(output_ids), meta


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
        body = await response.read()
        if response.status != 200:
            raise RequestFailed(classify_status(response.status), error_reason(body), response.status)
        return orjson.loads(body)


async def fetch_server_info(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """GET /server_info (SGLang >= 0.5.10), falling back to the deprecated /get_server_info."""
    try:
        return await get_json(session, url.rstrip("/") + "/server_info")
    except RequestFailed as failure:
        if failure.status != 404:
            raise
    return await get_json(session, url.rstrip("/") + "/get_server_info")


def make_session(concurrency: int, endpoints: int) -> aiohttp.ClientSession:
    """One pooled session: keep-alive connections sized to the in-flight limit, orjson for JSON."""
    connector = aiohttp.TCPConnector(
        limit=concurrency + 4 * endpoints, limit_per_host=0, keepalive_timeout=120, ttl_dns_cache=60
    )
    return aiohttp.ClientSession(
        connector=connector, json_serialize=lambda obj: orjson.dumps(obj).decode(), raise_for_status=False
    )
