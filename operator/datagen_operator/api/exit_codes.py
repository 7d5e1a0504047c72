"""The `datagen worker` exit codes: what the worker says, and what the local runner and the operator's
workers Job read (which ones a retry can fix is control/policy.py). docs/worker.md explains each to a person."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FINGERPRINT_MISMATCH = 3
EXIT_SERVER_UNREACHABLE = 4
EXIT_DRAINED = 5
EXIT_INCOMPLETE = 6
EXIT_OUTPUT_VOLUME = 7

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
