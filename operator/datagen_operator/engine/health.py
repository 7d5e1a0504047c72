"""SGLang's health endpoints as the pinned release serves them, and the waits that follow from them.

`/health` and `/health_generate` (sglang/srt/entrypoints/http_server.py `health_generate`; `/health` too while
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is on, its default) answer 503 at once while the server starts or shuts
down; otherwise they send a one-token generation, look every second (the first look after a second) for any
output of the scheduler since the call, answer 200 when there is some, and 503 after HEALTH_CHECK_TIMEOUT_S
without any, while `/generate` is still served. So an answer takes at least a second, a busy-but-working
server answers 200, and a server that stalls answers 503 only after 20 s. Its watchdog (--watchdog-timeout)
ends the process itself when a forward pass is stuck that long.
"""

from __future__ import annotations

import math
import os

HEALTH_CHECK_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
HEALTH_CHECK_TIMEOUT_S = 20
"""How long SGLang's health call waits for scheduler output before it answers 503 (env override above)."""
HEALTH_POLL_S = 1.0
"""SGLang looks for that output once a second, the first time a second after the call."""
WATCHDOG_FLAG = "--watchdog-timeout"
WATCHDOG_TIMEOUT_S = 300
"""SGLang's --watchdog-timeout default: a forward pass stuck this long ends the server process."""

HEALTH_ANSWER_TIMEOUT_S = HEALTH_CHECK_TIMEOUT_S + 2 * HEALTH_POLL_S + 3
"""How long a caller waits for a health answer: past SGLang's own verdict (its timeout and a poll), so a stall
is judged by SGLang, not cut short by our impatience."""


def health_check_timeout_s(environ: dict[str, str] | None = None) -> float:
    """SGLang's health timeout as the server's environment sets it (`int(os.getenv(...))` there)."""
    value = (environ if environ is not None else os.environ).get(HEALTH_CHECK_TIMEOUT_ENV)
    return float(int(value)) if value else float(HEALTH_CHECK_TIMEOUT_S)


def liveness_failure_threshold(period_s: int, watchdog_timeout_s: float = WATCHDOG_TIMEOUT_S) -> int:
    """Failed liveness probes before the kubelet restarts the server: enough that a stall SGLang's watchdog
    still tolerates (and the health call's own wait) never costs a model reload; a hung process is killed by
    the watchdog first, or by the kubelet one period after it should have been."""
    return math.ceil((watchdog_timeout_s + HEALTH_ANSWER_TIMEOUT_S) / period_s) + 1
