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

import enum
from dataclasses import dataclass
from typing import Any

import orjson

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
    return unit * min(policy.cap_s, policy.base_s * 2.0 ** max(0, attempt - 1))


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
