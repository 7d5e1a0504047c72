"""The exit codes of the programs the shells start: what `datagen worker` says, and what the local runner and
the operator's workers Job read (which ones a retry can fix is control/policy.py; docs/worker.md explains each
to a person); and what the step programs (`datagen preflight`, `canary`, `verify`, `export`) say, which the
operator's step Jobs fail on."""

from __future__ import annotations

import math

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FINGERPRINT_MISMATCH = 3
EXIT_SERVER_UNREACHABLE = 4
EXIT_DRAINED = 5
EXIT_INCOMPLETE = 6
EXIT_OUTPUT_VOLUME = 7

# How a worker told to stop ends with EXIT_DRAINED: the worker's drain and the time its stopper (the workers Job's
# grace period, the local runner) allows, one rule for both sides.
WORKER_DRAIN_S = 25.0
"""How long a worker told to stop (SIGTERM) waits for its in-flight requests before it abandons them
(`datagen worker --drain-timeout`'s default)."""
FINAL_FSYNC_MARGIN_S = 15.0
"""After the drain: the segments flushed and fsynced, progress.json and the termination message written."""
WORKER_GRACE_S = math.ceil(WORKER_DRAIN_S + FINAL_FSYNC_MARGIN_S)
"""SIGTERM to SIGKILL for a worker (the workers Job's terminationGracePeriodSeconds, the local runner's stop):
longer than the drain, so a stopped worker always ends on its own, its files synced (EXIT_DRAINED), and is
never killed mid-write."""

EXIT_FAILED_VERDICT = 1
"""A step program's verdict is written (stdout, --termination-log) and it is not a pass: a refusal or a failed
check. Running the step again gives the same verdict, so its Job fails at once, no retry (k8s/job_manifests.py).
A step exits EXIT_OK with a passing verdict, EXIT_BAD_INPUT when there is nothing it can judge. No worker code:
from the worker, 1 is Python's uncaught exception, a crash, which is retried."""
EXIT_STEP_CRASHED = 70
"""A step program crashed (an uncaught exception, sysexits' EX_SOFTWARE): it wrote no verdict. Python itself
would exit 1, EXIT_FAILED_VERDICT, and the step's Job would fail at once on a volume hiccup; no rule of the
Job matches 70, so it retries the pod (its backoffLimit), and the last traceback is the termination message."""


def verdict_exit(passed: bool) -> int:
    """A step program's exit once its verdict is written."""
    return EXIT_OK if passed else EXIT_FAILED_VERDICT


MEANINGS: dict[int, str] = {
    EXIT_OK: "the shard is complete (every record written or permanently rejected) and compacted to Parquet",
    EXIT_BAD_INPUT: "bad input: arguments, spec, dataset or tokenizer unusable (retrying cannot help)",
    EXIT_FINGERPRINT_MISMATCH: "fingerprint mismatch: the output or a server belongs to a different "
    "tokenizer/template/server/sampling/preset/shard count",
    EXIT_SERVER_UNREACHABLE: "servers unreachable past --server-timeout",
    EXIT_DRAINED: "drained after SIGTERM/SIGINT: in-flight requests finished or abandoned, files synced; rerun resumes",
    EXIT_INCOMPLETE: "incomplete: some records ran out of attempts (or compaction failed); rerun resumes exactly those",
    EXIT_OUTPUT_VOLUME: "output volume failed (full, over quota, read-only, I/O error): requests stopped at once, "
    "whole records kept; free space or grow the volume and rerun (retrying on the same volume cannot help)",
}


def exit_codes_help() -> str:
    """The codes as `datagen worker --help` lists them."""
    return "\n".join(f"  {code}  {meaning}" for code, meaning in MEANINGS.items())
