"""Small reads from a running SGLang server: health and a chat-completions probe.

Bulk /generate traffic and /server_info live in worker/client.py; this module serves readiness and the
parser verification, shared by the operator and the local runner.
"""

from __future__ import annotations

from typing import Any

import aiohttp

HEALTH_TIMEOUT_S = 10.0
"""A 1-trillion-parameter model can take about a second on /health_generate; never probe with 1 s."""


async def is_healthy(session: aiohttp.ClientSession, base_url: str, path: str = "/health_generate") -> bool:
    """SGLang answers 200 or 503 with an EMPTY body: the status code is the whole answer (field notes 6)."""
    try:
        async with session.get(base_url + path, timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
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
