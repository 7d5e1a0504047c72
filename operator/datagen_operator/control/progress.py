"""Shard progress snapshots (progress.json locally, the per-shard ConfigMaps in a cluster) summed for decide()."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from datagen_operator.checks.evaluate import Tally
from datagen_operator.control.observed import ProgressCounters

FINISHED_STATES = frozenset({"done", "complete", "completed"})


def counters_from_snapshots(snapshots: Iterable[Mapping[str, Any]]) -> ProgressCounters:
    """Sum the workers' snapshots (ShardProgress as JSON); unknown keys are ignored, missing ones are 0."""
    prompts_total = prompts_done = completion = malformed = records = rejected = tool_records = 0
    rate = 0.0
    flags: dict[str, int] = {}
    for s in snapshots:
        prompts_total += int(s.get("prompts_total", 0))
        prompts_done += int(s.get("prompts_done", 0))
        completion += int(s.get("output_tokens", 0))
        # `set_aside` counts every cause (malformed lines, unrenderable, too long); older workers only malformed.
        set_aside = s.get("set_aside")
        malformed += sum(map(int, set_aside.values())) if set_aside else int(s.get("prompts_malformed", 0))
        records += int(s.get("records_done", 0))
        rejected += int(s.get("records_rejected", 0))
        tool_records += int(s.get("tool_records", 0))
        if s.get("state") not in FINISHED_STATES:
            rate += float(s.get("tokens_per_s", 0.0))
        for name, count in (s.get("flags") or {}).items():
            flags[name] = flags.get(name, 0) + int(count)
    return ProgressCounters(
        prompts_total=prompts_total,
        prompts_done=prompts_done,
        completion_tokens=completion,
        tokens_per_second=rate,
        malformed=malformed,
        tally=Tally(records=records, tool_records=tool_records, rejected=rejected, flags=flags),
    )
