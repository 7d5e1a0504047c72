"""POST /generate: retries by the policy, waits out outages, joins streamed deltas; the bodies parsed without copies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from datagen_operator.engine import wire
from datagen_operator.engine.client.policy import (
    Drained,
    GaveUp,
    Rejected,
    RequestFailed,
    RetryPolicy,
    Verdict,
    abort_verdict,
    backoff_delay,
    classify_answer,
    error_reason,
    stream_error_verdict,
)
from datagen_operator.engine.client.pool import Endpoint, EndpointPool

log = logging.getLogger("datagen.engine.client")

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

    async def generate(self, payload: bytes, affinity: Hashable | None = None) -> Reply:
        """POST the payload until it succeeds, is rejected, or runs out of attempts. Requests of one `affinity`
        key (a conversation) go where the last one was answered (`EndpointPool.pick`)."""
        attempts = 0  # tries that count against max_attempts
        tries = 0  # every request sent (what the record reports)
        outages = 0
        busy_since: float | None = None  # first of the overload refusals in a row
        refusals = 0
        while True:
            endpoint = await self.pool.acquire(affinity)
            tries += 1
            started = time.monotonic()
            try:
                output_ids, meta, raw = await self._post(endpoint, payload)
                endpoint.served += 1
                if affinity is not None:
                    self.pool.pin(affinity, endpoint)
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
            if verdict is Verdict.BUSY:
                # A live server shedding load: waiting is the cure, so no attempt is spent and the endpoint stays.
                self.on_retry("overloaded")
                now = time.monotonic()
                busy_since = now if busy_since is None else busy_since
                if now - busy_since >= self.pool.unreachable_after_s:
                    raise GaveUp(f"{reason} (the server shed this request for {now - busy_since:.0f}s)", tries)
                refusals += 1
                await self._back_off(backoff_delay(refusals, self.policy, self.rng.random()), reason)
                continue
            busy_since, refusals = None, 0
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
            await self._back_off(backoff_delay(attempts, self.policy, self.rng.random()), reason)

    async def _back_off(self, delay: float, reason: str) -> None:
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
                raise RequestFailed(classify_answer(response.status, body), error_reason(body), response.status)
            raw: bytes | None = None
            output_ids: wire.WireIds | Sequence[int]
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
                    raise RequestFailed(*stream_error_verdict(error_body))
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
