"""A shard's progress as the worker publishes it, and the one counter of what became of records and prompts.

The worker writes a ShardProgress as JSON to `shards/<i>/progress.json` and, in a cluster, into the
shard's ConfigMap; the operator and `datagen run` read it back with `from_storage` and sum the shards
(control/progress.py). `Counts` is what the worker, the store's segment summaries, control's sum,
status.progress, the checks and `datagen verify` count, so none of them can drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

from datagen_operator.api.words import plural

STATES = ("starting", "running", "paused", "draining", "compacting", "complete", "incomplete", "drained", "failed")
"""paused: every server is down; incomplete: some records ran out of attempts (rerun resumes them);
drained: stopped by SIGTERM (resumable); failed: refused to run, the servers stayed unreachable, or the output
volume failed (`failure_reason`)."""
TOO_LONG = "too_long"
"""The cause of a prompt set aside because prompt + max_new_tokens exceeds the server's context."""
UNRENDERABLE = "unrenderable"
"""The cause of a prompt set aside because the chat template cannot render it."""
DUPLICATE_ID = "duplicate_id"
"""The cause of a dataset line set aside because an earlier line has its id (or, without ids, its content): the
conversation is generated once, for the first. Counted apart from the malformed lines: nothing is wrong with it."""
FINISHED_STATES = frozenset({"complete", "incomplete", "drained", "failed"})
"""States a worker publishes last, as it exits: it no longer produces tokens."""


@dataclass
class Counts:
    """What became of a set of records and prompts (a shard's, a run's, a whole output's, the canary's): the one
    counter the worker's snapshot, the store's segment summaries, control's sum, status.progress and
    `datagen verify` share. Many are summed by `sum_counts` (two by `+`; what a stale snapshot lost is taken off
    with `-`); no count is derived from another twice.

    Server refusals (`refused`) and prompts set aside unsent (`set_aside`) are different causes: the first is the
    server's answer, the second never reached it."""

    records: int = 0
    """Records written (resumed ones included)."""
    tool_records: int = 0
    """Records whose prompt offered tools (the denominator of the tool-call checks)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    flags: Counter[str] = field(default_factory=Counter)
    """Inline check flag -> records raising it (checks.record_checks)."""
    lines: int = 0
    """Dataset lines looked at: valid prompts plus malformed lines (what the set-aside rates are out of)."""
    set_aside: dict[str, int] = field(default_factory=dict)
    """cause -> prompts set aside unsent, never sent nor retried: a malformed dataset line (prompts.line_shape.CAUSES),
    `unrenderable`, `too_long` (prompt + max_new_tokens over the context), `no_user_turn`."""
    records_set_aside: int = 0
    """Records never made, not for the server's sake: the samples of prompts set aside after the dataset was read,
    and the turns of conversations cut short (counted by cause in ShardProgress.turns_cut)."""
    refused: int = 0
    """Records the server refused (HTTP 4xx): the server errors."""
    failed: int = 0
    """Records that ran out of attempts (5xx, timeouts, resets); a rerun retries them."""
    unwritten: int = 0
    """Answers received that the output volume could not take (full, read-only, I/O errors); a rerun makes them
    again."""
    sampled_prompts: int = 0
    """Prompts whose samples (two or more, of the first turn) were compared, where samples should differ
    (checks.samples): counted where the samples come back together (a worker counts this run's, verify every
    prompt's), never in the store's segment summaries."""
    identical_samples: int = 0
    """... and those of them whose samples all came back identical."""

    @property
    def too_long(self) -> int:
        """Prompts set aside for length."""
        return self.set_aside.get(TOO_LONG, 0)

    @property
    def duplicates(self) -> int:
        """Dataset lines set aside as repeats of an earlier line."""
        return self.set_aside.get(DUPLICATE_ID, 0)

    @property
    def unusable(self) -> int:
        """Prompts set aside for any cause but length or repetition: a malformed line, or a prompt the template
        cannot render."""
        return sum(self.set_aside.values()) - self.too_long - self.duplicates

    def count(self, *flags: str) -> int:
        """Records raising any of `flags` (each flag counted apart)."""
        return sum(self.flags.get(name, 0) for name in flags)

    def add(
        self, prompt_tokens: int, output_tokens: int, cached_tokens: int, flags: Iterable[str], has_tools: bool
    ) -> None:
        """One written record."""
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

    def set_aside_one(self, cause: str) -> None:
        self.set_aside[cause] = self.set_aside.get(cause, 0) + 1

    def merge(self, other: Counts) -> None:
        """Add `other` in place (the worker's and the store's running counts)."""
        for name in _NUMBERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.flags.update(other.flags)
        for cause, n in other.set_aside.items():
            self.set_aside[cause] = self.set_aside.get(cause, 0) + n

    def __add__(self, other: Counts) -> Counts:
        return self._combined(other, 1)

    def __sub__(self, baseline: Counts) -> Counts:
        return self._combined(baseline, -1)

    def _combined(self, other: Counts, sign: int) -> Counts:
        numbers = {name: getattr(self, name) + sign * getattr(other, name) for name in _NUMBERS}
        flags, set_aside = Counter(self.flags), dict(self.set_aside)
        for name, n in other.flags.items():
            flags[name] += sign * n
        for cause, n in other.set_aside.items():
            set_aside[cause] = set_aside.get(cause, 0) + sign * n
        kept = {cause: n for cause, n in set_aside.items() if n}
        return Counts(**numbers, flags=Counter({name: n for name, n in flags.items() if n}), set_aside=kept)

    def for_storage(self) -> dict[str, Any]:
        return {**asdict(self), "flags": dict(self.flags), "set_aside": dict(self.set_aside)}

    @classmethod
    def from_storage(cls, data: Mapping[str, Any]) -> Counts:
        """A count missing from `data` reads as 0 (a segment summary written before it was counted)."""
        numbers = {name: int(data.get(name) or 0) for name in _NUMBERS}
        return cls(**numbers, flags=Counter(_int_map(data.get("flags"))), set_aside=_int_map(data.get("set_aside")))


def sum_counts(counts: Iterable[Counts]) -> Counts:
    """The one sum of many counts (shards into a run)."""
    total = Counts()
    for c in counts:
        total.merge(c)
    return total


def _int_map(data: Mapping[str, Any] | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in (data or {}).items()}


_NUMBERS = tuple(f.name for f in fields(Counts) if f.name not in ("flags", "set_aside"))


_STORED_AS = {
    "records": "records_done",
    "refused": "records_rejected",
    "failed": "records_failed",
    "unwritten": "records_unwritten",
    "lines": "dataset_lines",
}
"""Counts' names in a stored snapshot, where they sit flat beside the shard's other fields: the names older
workers wrote, so that a snapshot of either version reads the same."""


@dataclass
class ShardProgress:
    shard: int
    shard_count: int
    state: str = "starting"
    """One of STATES."""
    prompts_total: int = 0
    """Valid prompts of this shard read so far (malformed lines not included)."""
    prompts_done: int = 0
    """Prompts with nothing left to do: every sample recorded, refused by the server or set aside."""
    turns_cut: dict[str, int] = field(default_factory=dict)
    """generation.turns all: cause -> turns of conversations not generated (prompts.conversation.TURN_CAUSES): the
    user turns after a dataset tool message (never planned), and the rest of a conversation after an answer that
    called a tool, did not finish, or was refused (counted in counts.records_set_aside, per sample)."""
    records_by_turn: dict[str, int] = field(default_factory=dict)
    """generation.turns all: this run's records by turn index ("0" = the answer to the first user turn)."""
    flagged_by_turn: dict[str, int] = field(default_factory=dict)
    """... and those of them that raised a check flag."""
    records_total: int = 0
    counts: Counts = field(default_factory=Counts)
    """What became of the shard's records and prompts (resumed records included; `failed` and `unwritten` are
    this run's). Stored flat beside the other fields (_STORED_AS)."""
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

    @property
    def records_done(self) -> int:
        return self.counts.records

    @records_done.setter
    def records_done(self, value: int) -> None:
        self.counts.records = value

    @property
    def malformed_lines(self) -> int:
        """Dataset lines of this shard that are not usable prompts (set aside as read)."""
        return self.counts.lines - self.prompts_total

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def for_storage(self, *, indent: bool = False) -> bytes:
        body = asdict(self)
        del body["counts"]
        body.update({_STORED_AS.get(name, name): value for name, value in self.counts.for_storage().items()})
        return orjson.dumps(body, option=orjson.OPT_INDENT_2 if indent else 0)

    @classmethod
    def from_storage(cls, data: bytes | str) -> ShardProgress:
        """Raises orjson.JSONDecodeError (a ValueError) or TypeError when `data` is not a snapshot; keys this
        version does not know are ignored, missing ones take their defaults. A snapshot of an older worker
        (no dataset_lines; prompts_malformed, prompts_rejected, prompts_too_long) reads the same."""
        body = orjson.loads(data)
        if not isinstance(body, dict):
            raise TypeError(f"a shard's progress is a JSON object, not {type(body).__name__}")
        known = {f.name for f in fields(cls)} - {"counts"}
        counts = Counts.from_storage({name: body.get(_STORED_AS.get(name, name)) for name in _COUNT_NAMES})
        if "dataset_lines" not in body:
            counts.lines = int(body.get("prompts_total") or 0) + int(body.get("prompts_malformed") or 0)
        if "set_aside" not in body:
            counts.set_aside = {
                cause: int(body[old]) for old, cause in _OLD_SET_ASIDE.items() if int(body.get(old) or 0)
            }
        return cls(**{key: value for key, value in body.items() if key in known}, counts=counts)

    def summary_line(self) -> str:
        set_aside = sum(self.counts.set_aside.values())
        return (
            f"shard {self.shard}/{self.shard_count} {self.state}: {self.prompts_done}/{self.prompts_total} prompts, "
            f"{self.records_done}/{self.records_total} records, {self.tokens_per_s / 1000:.1f}k tok/s"
            + (f", {plural(set_aside, 'prompt')} set aside" if set_aside else "")
        )


_COUNT_NAMES = tuple(f.name for f in fields(Counts))
_OLD_SET_ASIDE = {"prompts_malformed": "malformed", "prompts_rejected": UNRENDERABLE, "prompts_too_long": TOO_LONG}
"""Before set_aside by cause, a snapshot counted the prompts set aside in three numbers."""
