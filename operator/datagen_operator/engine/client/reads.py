"""Small reads from a running SGLang server: health, /server_info, the chat-completions probe; the pooled session."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from datagen_operator.engine.client.policy import RequestFailed, classify_status, error_reason
from datagen_operator.engine.health import HEALTH_ANSWER_TIMEOUT_S

HEALTH_TIMEOUT_S = HEALTH_ANSWER_TIMEOUT_S
"""Past SGLang's own verdict: a health call takes a second at least and 503s only after 20 s without scheduler
output (engine/health.py); a shorter wait would call a slow-but-working server unhealthy."""


async def is_healthy(
    session: aiohttp.ClientSession, base_url: str, path: str = "/health_generate", timeout_s: float = HEALTH_TIMEOUT_S
) -> bool:
    """SGLang answers 200 or 503 with an EMPTY body: the status code is the whole answer (SGLang 0.5.23
    sglang/srt/entrypoints/http_server.py `health_generate`); never look for 'ok' in it."""
    try:
        async with session.get(base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


PROBE_QUESTION = "Is 221 a prime number? Think it through, then answer yes or no."


def chat_probe_body(model: str, template_kwargs: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The parser probe's request: one question through the server's own template and reasoning parser."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROBE_QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "chat_template_kwargs": template_kwargs,
    }


async def chat_probe(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    template_kwargs: dict[str, Any],
    max_tokens: int,
) -> dict[str, Any]:
    """One chat completion; returns the choice (`message`, `finish_reason`), so a cut reply is never judged
    as a whole one."""
    body = chat_probe_body(model, template_kwargs, max_tokens)
    timeout = aiohttp.ClientTimeout(total=max(300.0, max_tokens / 20))  # slow GPUs still finish long replies
    async with session.post(base_url + "/v1/chat/completions", json=body, timeout=timeout) as response:
        payload = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"chat completions probe got HTTP {response.status}: {payload}")
    choice: dict[str, Any] = payload["choices"][0]
    return choice


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
        body = await response.read()
        if response.status != 200:
            raise RequestFailed(classify_status(response.status), error_reason(body), response.status)
        return orjson.loads(body)


async def fetch_server_info(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """GET /server_info (SGLang >= 0.5.10), falling back to the deprecated /get_server_info."""
    info: dict[str, Any]
    try:
        info = await get_json(session, url.rstrip("/") + "/server_info")
        return info
    except RequestFailed as failure:
        if failure.status != 404:
            raise
    info = await get_json(session, url.rstrip("/") + "/get_server_info")
    return info


def make_session(concurrency: int, endpoints: int) -> aiohttp.ClientSession:
    """One pooled session: keep-alive connections sized to the in-flight limit, orjson for JSON."""
    connector = aiohttp.TCPConnector(
        limit=concurrency + 4 * endpoints, limit_per_host=0, keepalive_timeout=120, ttl_dns_cache=60
    )
    return aiohttp.ClientSession(
        connector=connector, json_serialize=lambda obj: orjson.dumps(obj).decode(), raise_for_status=False
    )
