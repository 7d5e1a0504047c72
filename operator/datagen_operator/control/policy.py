"""Retry policies, defined once: the Job builder (k8s/job_manifests.py) and the local runner both read them.

A shard's worker exit is one of: done, retried for free (the server was away or the worker was told to stop),
retried against a bound (a crash), or failed for good (a retry cannot help until a person changes something).
"""

from __future__ import annotations

from enum import StrEnum

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_OK,
    EXIT_OUTPUT_VOLUME,
    EXIT_SERVER_UNREACHABLE,
)

SHARD_RETRIES = 3
"""Crashes a shard survives: its 4th counted failure fails it (the Job's backoffLimitPerIndex)."""
FREE_EXITS: tuple[int, ...] = (EXIT_SERVER_UNREACHABLE, EXIT_DRAINED)
"""A server outage or a stop: retried without counting (podFailurePolicy Ignore)."""
PERMANENT_EXITS: dict[int, str] = {
    EXIT_BAD_INPUT: "bad input",
    EXIT_FINGERPRINT_MISMATCH: "fingerprint mismatch",
    # Fix the volume, then rerun: a retry now would only fill it again.
    EXIT_OUTPUT_VOLUME: "output volume",
}
"""Exits a rerun cannot fix without a person (podFailurePolicy FailIndex), with what they mean."""

SERVER_RESTARTS = 3
"""Exits a server process survives on one machine (`datagen run`): after its 3rd restart, an exit ends the run.
In a cluster the kubelet restarts a server pod itself (restartPolicy Always, its own CrashLoopBackOff from 10 s
to 5 min) and ServerReady says CrashLoop until the pod stays up or server.startupTimeout is spent."""
SERVER_RESTART_BACKOFF_S = 2.0
"""The wait before a server process's first restart, doubled for each restart after it: a server that exits
at once (a port still held, a GPU not yet free) gets a moment, and giving up takes seconds, not minutes."""


def server_restart_delay_s(restarts: int) -> float | None:
    """How long to wait before restarting a server that exited after `restarts` restarts; None: give up."""
    if restarts >= SERVER_RESTARTS:
        return None
    return SERVER_RESTART_BACKOFF_S * float(2**restarts)


PARSER_PROBE_ATTEMPTS = 5
"""Reads of a ready server's parsers that may fail before the run halts with ProbeFailed: a server that
answers its health checks but not /server_info (or the chat probe) this often will not by waiting."""


class ShardExit(StrEnum):
    DONE = "Done"
    RETRY_FREE = "RetryFree"
    RETRY = "Retry"
    FAILED = "Failed"
    """Failed for good: a permanent exit, or a crash past SHARD_RETRIES."""


def shard_exit(code: int, retries: int) -> ShardExit:
    """What a worker's exit `code` means for its shard, `retries` counted crashes before this one."""
    if code == EXIT_OK:
        return ShardExit.DONE
    if code in PERMANENT_EXITS:
        return ShardExit.FAILED
    if code in FREE_EXITS:
        return ShardExit.RETRY_FREE
    return ShardExit.RETRY if retries < SHARD_RETRIES else ShardExit.FAILED
