"""The /generate HTTP client: retries, pauses while servers are down, spreads over endpoints, streams deltas.

Failure policy (pure, in `classify_status` and `backoff_delay`):
- 2xx: done. A 200 whose finish_reason is `abort` is classified by its status_code like an HTTP answer.
- Overload: SGLang itself answered 503 (its error envelope, or an abort finish_reason with status 503: a full
  queue under --max-queued-requests, SGLANG_REQ_WAITING_TIMEOUT / _RUNNING_TIMEOUT; scheduler.py
  `_abort_on_queued_limit`, `_poll_timeout_aborts`). The server is alive: the request backs off and goes again,
  the endpoint stays in rotation and no attempt is spent; a request refused so for `unreachable_after_s` in a
  row is left for the next run.
- A bare 503 (no SGLang envelope: a proxy with no backend, a server warming up) or connection refused: the
  server is down or restarting. The endpoint is taken out of rotation and probed (GET /health) until it
  answers 200; requests wait for any endpoint, without spending attempts. Only if every endpoint stays down
  past `unreachable_after_s` does the worker give up (exit code 4).
- Other 5xx, 408, 429, connection resets, timeouts, retryable mid-stream errors: retried with capped
  exponential backoff and full jitter, at most `max_attempts` tries. A reset on an endpoint that a probe
  then finds down counts as an outage, not an attempt.
- Other 4xx (400: bad sampling params, prompt too long): permanent; the record goes to rejects.jsonl.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson

# --- pure decisions --------------------------------------------------------------------------------


class Verdict(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    DOWN = "down"
    BUSY = "busy"
    REJECT = "reject"


def classify_answer(status: int, body: bytes) -> Verdict:
    """An HTTP answer's verdict: a 503 that carries SGLang's own error envelope (`{"object": "error", ...}` from
    its HTTPException handler, or `{"error": ...}`) came from a live server shedding load; any other 503 means
    no server behind the address."""
    verdict = classify_status(status)
    if verdict is Verdict.DOWN and _is_error_envelope(body):
        return Verdict.BUSY
    return verdict


def _is_error_envelope(body: bytes) -> bool:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and (obj.get("object") == "error" or "error" in obj)


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
    # The exponent stops growing long after the cap is reached: an overloaded server refuses a request without
    # limit on attempts, and 2.0 ** 1024 overflows.
    return unit * min(policy.cap_s, policy.base_s * 2.0 ** min(max(0, attempt - 1), 64))


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
    if verdict is Verdict.DOWN:  # the scheduler itself aborted it: the server is alive and shedding load
        verdict = Verdict.BUSY
    return verdict, f"aborted: {message}"


def stream_error_verdict(error: Any) -> tuple[Verdict, str, int | None]:
    """The error event SGLang streams before `[DONE]` (`http_server.serve_generate_request`: a ValueError,
    `{"message", "type", "code", "retryable"}`): its status is `code` (400 unless the error carries another)."""
    if not isinstance(error, dict):
        return Verdict.RETRY, f"stream error: {error}", None
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else None
    if error.get("retryable", True):
        verdict = Verdict.RETRY if status is None else classify_status(status)
        if verdict is Verdict.REJECT:  # the server says a retry may succeed
            verdict = Verdict.RETRY
    else:
        verdict = Verdict.REJECT if status is None or status < 500 else Verdict.RETRY
    if verdict is Verdict.DOWN:
        verdict = Verdict.BUSY
    return verdict, f"stream error: {error.get('message')}", status


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
