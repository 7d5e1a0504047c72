"""Small synchronous HTTP helpers for the simulator tests (stdlib only, loopback)."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """Server-sent events: each `data:` payload, JSON-decoded except the final "[DONE]"."""
        assert self.headers.get("content-type", "").startswith("text/event-stream"), self.headers
        chunks = self.body.decode("utf-8").split("\n\n")
        assert chunks[-1] == "", "a stream ends with a blank line"
        out = []
        for chunk in chunks[:-1]:
            assert chunk.startswith("data: "), chunk
            data = chunk[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
        return out


def request(url: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Reply:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        payload = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        connection.close()


def get(url: str, path: str, timeout_s: float = 30.0) -> Reply:
    return request(url, "GET", path, timeout_s=timeout_s)


def post(url: str, path: str, body: Any, timeout_s: float = 30.0) -> Reply:
    return request(url, "POST", path, body, timeout_s=timeout_s)


def generate(url: str, body: Any, timeout_s: float = 30.0) -> Any:
    """POST /generate expecting 200; the decoded JSON."""
    reply = post(url, "/generate", body, timeout_s)
    assert reply.status == 200, (reply.status, reply.body[:500])
    return reply.json()
