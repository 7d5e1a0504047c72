"""A shard's progress as the worker publishes it, and the one counter of written records.

The worker writes a ShardProgress as JSON to `shards/<i>/progress.json` and, in a cluster, into the
shard's ConfigMap; the operator and `datagen run` read it back with `from_storage` and sum the shards
(control/progress.py). RecordCounts is what the worker, the store's segment summaries and the checks'
tallies count per written record, so the three cannot drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

STATES = ("starting", "running", "paused", "draining", "compacting", "complete", "incomplete", "drained", "failed")
"""paused: every server is down; incomplete: some records ran out of attempts (rerun resumes them);
drained: stopped by SIGTERM (resumable); failed: refused to run, the servers stayed unreachable, or the output
volume failed (`failure_reason`)."""
FINISHED_STATES = frozenset({"complete", "incomplete", "drained", "failed"})
"""States a worker publishes last, as it exits: it no longer produces tokens."""


@dataclass
class RecordCounts:
    """Exact counts over a set of written records."""

    records: int = 0
    tool_records: int = 0
    """Records whose prompt offered tools (the denominator of the tool-call checks)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    flags: Counter[str] = field(default_factory=Counter)
    """Inline check flag -> records raising it (checks.record_checks)."""

    def add(
        self, prompt_tokens: int, output_tokens: int, cached_tokens: int, flags: Iterable[str], has_tools: bool
    ) -> None:
        self.records += 1
        self.tool_records += has_tools
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        self.cached_tokens += cached_tokens
        if flags:
            self.flags.update(flags)

    def add_record(self, record: Mapping[str, Any]) -> None:
        """A stored record (output/records.py's shape)."""
        self.add(
            len(record["input_ids"]),
            len(record["output_ids"]),
            record.get("cached_tokens") or 0,
            record["flags"],
            bool(record.get("has_tools")),
        )

    def merge(self, other: RecordCounts) -> None:
        for f in fields(self):
            if f.name != "flags":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.flags.update(other.flags)

    def for_storage(self) -> dict[str, Any]:
        return {**asdict(self), "flags": dict(self.flags)}

    @classmethod
    def from_storage(cls, data: Mapping[str, Any]) -> RecordCounts:
        """A count missing from `data` reads as 0."""
        numbers = {f.name: int(data.get(f.name, 0)) for f in fields(cls) if f.name != "flags"}
        return cls(**numbers, flags=Counter({str(k): int(v) for k, v in (data.get("flags") or {}).items()}))


_COUNT_NAMES = ("records", "tool_records", "prompt_tokens", "output_tokens", "cached_tokens")
_FLAT = {"records": "records_done"}
"""RecordCounts' names in a stored snapshot, where they sit beside the other counters."""


@dataclass
class ShardProgress:
    shard: int
    shard_count: int
    state: str = "starting"
    """One of STATES."""
    prompts_total: int = 0
    """Valid prompts of this shard (malformed lines not included)."""
    prompts_done: int = 0
    """Prompts with nothing left to do: every sample recorded or permanently rejected."""
    prompts_malformed: int = 0
    """Dataset lines set aside when the dataset was read (bad JSON, id, messages, tools; duplicates)."""
    prompts_rejected: int = 0
    """Prompts the chat template could not render (set aside, never sent)."""
    prompts_too_long: int = 0
    """Prompts whose tokens + max_new_tokens exceed the server's context (set aside before sending)."""
    set_aside: dict[str, int] = field(default_factory=dict)
    """cause -> prompts set aside: the dataset causes (prompts.dataset.CAUSES), `unrenderable`, `too_long`."""
    turns_cut: dict[str, int] = field(default_factory=dict)
    """generation.turns all: cause -> turns of conversations not generated (prompts.conversation.TURN_CAUSES): the
    user turns after a dataset tool message (never planned), and the rest of a conversation after an answer that
    called a tool, did not finish, or was refused (counted in records_set_aside, per sample)."""
    records_by_turn: dict[str, int] = field(default_factory=dict)
    """generation.turns all: this run's records by turn index ("0" = the answer to the first user turn)."""
    flagged_by_turn: dict[str, int] = field(default_factory=dict)
    """... and those of them that raised a check flag."""
    records_total: int = 0
    counts: RecordCounts = field(default_factory=RecordCounts)
    """The written records (resumed ones included): stored flat as records_done, tool_records,
    prompt_tokens, output_tokens, cached_tokens and flags."""
    records_rejected: int = 0
    """Records the server refused (4xx): the server errors."""
    records_set_aside: int = 0
    """Samples of prompts set aside after the dataset was read (unrenderable, too long): not server errors."""
    records_failed: int = 0
    """Records that ran out of attempts in this run; the next run tries them again."""
    errors: dict[str, int] = field(default_factory=dict)
    """Retried failures by kind (http_500, timeout, connection_error, server_down...), this run."""
    in_flight: int = 0
    tokens_per_s: float = 0.0
    """Output tokens per second over the last 30 s."""
    servers_up: int = 0
    servers_total: int = 0
    started_at: float = 0.0
    updated_at: float = 0.0
    message: str = ""
    fingerprint_sha256: str = ""
    """The output's data fingerprint (manifest.json), so the operator can show it in status."""
    failure_reason: str = ""
    """With state failed, the cause as a condition reason: OutputVolumeFull, OutputVolumeReadOnly,
    OutputVolumeError (the output volume could not be written; `message` says what to do)."""
    volume_path: str = ""
    volume_free_bytes: int | None = None
    """Free bytes of the output volume when it failed."""
    records_unwritten: int = 0
    """Answers this run received but could not write (the volume failed); a rerun generates them again."""

    @property
    def records_done(self) -> int:
        return self.counts.records

    @records_done.setter
    def records_done(self, value: int) -> None:
        self.counts.records = value

    @property
    def output_tokens(self) -> int:
        return self.counts.output_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.counts.prompt_tokens

    @property
    def flags(self) -> Counter[str]:
        return self.counts.flags

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def for_storage(self, *, indent: bool = False) -> bytes:
        body = asdict(self)
        counts = body.pop("counts")
        body.update({_FLAT.get(name, name): value for name, value in counts.items()}, flags=dict(self.counts.flags))
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 if indent else 0)

    @classmethod
    def from_storage(cls, data: bytes | str) -> ShardProgress:
        """Raises orjson.JSONDecodeError (a ValueError) or TypeError when `data` is not a snapshot; keys this
        version does not know are ignored, missing ones take their defaults."""
        body = orjson.loads(data)
        if not isinstance(body, dict):
            raise TypeError(f"a shard's progress is a JSON object, not {type(body).__name__}")
        known = {f.name for f in fields(cls)} - {"counts"}
        counts = RecordCounts.from_storage(
            {name: body.get(_FLAT.get(name, name), 0) for name in _COUNT_NAMES} | {"flags": body.get("flags")}
        )
        return cls(**{key: value for key, value in body.items() if key in known}, counts=counts)

    def summary_line(self) -> str:
        set_aside = sum(self.set_aside.values())
        return (
            f"shard {self.shard}/{self.shard_count} {self.state}: {self.prompts_done}/{self.prompts_total} prompts, "
            f"{self.records_done}/{self.records_total} records, {self.tokens_per_s / 1000:.1f}k tok/s"
            + (f", {set_aside} prompts set aside" if set_aside else "")
        )
