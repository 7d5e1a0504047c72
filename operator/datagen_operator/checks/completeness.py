"""Completeness of an output, keyed by (id, sample, turn): what `datagen verify` expects (every valid prompt x
sample x planned turn), what the records hold, and what is accounted instead of a record (server refusals, prompts
set aside unsent, turns never sent: rejects.jsonl). Pure: key hashes and rejects entries in, checks and counts out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.progress import Counts
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import plural
from datagen_operator.checks.evaluate import by_turn_words
from datagen_operator.output.layout import Key
from datagen_operator.output.records import TURNS_KIND

COMPLETENESS = "completeness"
CONVERSATIONS = "conversations"


@dataclass(frozen=True)
class SetAside:
    """What the worker set aside instead of generating: never sent, never a reason to rerun."""

    prompts: dict[str, str]
    """id -> cause, for valid dataset prompts set aside by the worker (unrenderable, too long)."""
    causes: dict[str, int]
    """cause -> lines or prompts, dataset-level causes included."""

    def summary(self) -> str:
        return ", ".join(f"{count} {cause}" for cause, count in sorted(self.causes.items()))


def account_set_aside(
    dataset_prompts: Iterable[tuple[int, str]] | None,
    dataset_causes: Iterable[str] | None,
    rejects: Iterable[Mapping[str, Any]],
) -> SetAside:
    """Match the workers' rejects.jsonl to the dataset.

    `dataset_prompts`: (line, id) of every valid prompt, `dataset_causes`: the cause of every dataset line
    set aside when read (both None without the dataset). A valid prompt is set aside when a `line:<n>`
    entry for its own line carries its id (a duplicate's entry carries the kept prompt's id, on
    another line).
    """
    from datagen_operator.output.records import TOO_LONG, UNRENDERABLE, reject_cause
    from datagen_operator.prompts.conversation import NO_USER_TURN

    by_line = {
        entry.get("line"): entry
        for entry in rejects
        if entry.get("kind") != "server" and str(entry.get("key", "")).startswith("line:")
    }
    prompts: dict[str, str] = {}
    if dataset_prompts is None:
        causes = Counter(reject_cause(entry) for entry in by_line.values())
        for entry in by_line.values():
            if reject_cause(entry) in (TOO_LONG, UNRENDERABLE, NO_USER_TURN) and isinstance(entry.get("id"), str):
                prompts[entry["id"]] = reject_cause(entry)
        return SetAside(prompts, dict(causes))
    for line, prompt_id in dataset_prompts:
        rejected = by_line.get(line)
        if rejected is not None and rejected.get("id") == prompt_id:
            prompts[prompt_id] = reject_cause(rejected)
    causes = Counter(dataset_causes or ())
    causes.update(prompts.values())
    return SetAside(prompts, dict(causes))


@dataclass
class KeyCheck:
    """Completeness over (id, sample, turn) keys held as 64-bit hashes in sorted numpy arrays, so its memory is
    8 bytes a key; ids come back (a second pass) only to name a few examples. Two distinct keys share a
    hash with probability ~n^2/2^65 (3e-8 for a million)."""

    seen: Any
    """np.ndarray: the records' key hashes, unique, sorted."""
    wanted: Any = None
    """np.ndarray: the dataset's key hashes (every valid prompt x sample), unique, sorted; None: no dataset."""
    rejected: Any = None
    unsent: Any = None
    missing_examples: list[Key] = field(default_factory=list)
    extra_examples: list[Key] = field(default_factory=list)

    def missing(self) -> Any:
        return _minus(_minus(_minus(self.wanted, self.seen), self.rejected), self.unsent)

    def extra(self) -> Any:
        return _minus(self.seen, self.wanted)


def turns_cut_causes(rejects: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """cause -> turns of conversations never sent (records.turns_reject entries)."""
    causes: Counter[str] = Counter()
    for entry in rejects:
        if entry.get("kind") == TURNS_KIND:
            causes[str(entry.get("cause"))] += max(0, int(entry.get("turns") or 0) - int(entry.get("turn") or 0))
    return dict(causes)


def turns_cut_keys(rejects: Iterable[Mapping[str, Any]]) -> list[Key]:
    """The keys of conversations' turns never sent (records.turns_reject entries)."""
    keys: list[Key] = []
    for entry in rejects:
        if entry.get("kind") == TURNS_KIND and isinstance(entry.get("id"), str):
            first, planned = int(entry.get("turn") or 0), int(entry.get("turns") or 0)
            keys.extend((entry["id"], int(entry.get("sample", 0)), turn) for turn in range(first, planned))
    return keys


def _minus(a: Any, b: Any) -> Any:
    """The elements of sorted unique `a` not in sorted `b`: one binary search each, no re-sorting."""
    import numpy as np

    if not len(a) or not len(b):
        return a
    at = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return a[b[at] != a]


def sorted_unique(values: Any) -> Any:
    """np.unique of int64s by sorting: numpy 2.4's np.unique hashes plain ints, ~50x slower on a million."""
    import numpy as np

    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def key_hashes(keys: Iterable[Key]) -> Any:
    """Unique sorted 64-bit hashes of (id, sample, turn) keys (Python's hash: consistent within one process)."""
    import numpy as np

    return sorted_unique(np.fromiter((hash(key) for key in keys), dtype=np.int64))


def completeness(
    keys: KeyCheck, duplicates: int, set_aside: SetAside | None = None, turns_cut: Mapping[str, int] | None = None
) -> CheckResult:

    if keys.wanted is None:
        dup_note = f"; {duplicates} duplicate rows" if duplicates else ""
        return CheckResult(
            name=COMPLETENESS,
            passed=duplicates == 0,
            count=duplicates,
            total=len(keys.seen),
            verdict=f"dataset not available, only uniqueness checked{dup_note}; pass --dataset to check every id",
        )
    aside = set_aside or SetAside({}, {})
    # Set-aside prompts are accounted, not missing: a rerun would set them aside again.
    missing, extra = len(keys.missing()), len(keys.extra())
    problems = []
    if missing:
        problems.append(f"{missing} (id, sample, turn) missing, e.g. {keys.missing_examples}: rerun to resume them")
    if duplicates:
        problems.append(f"{duplicates} duplicate rows")
    if extra:
        problems.append(f"{plural(extra, 'record')} for ids not in the dataset, e.g. {keys.extra_examples}")
    if problems:
        return CheckResult(
            name=COMPLETENESS,
            passed=False,
            count=missing + duplicates + extra,
            total=len(keys.wanted),
            verdict="; ".join(problems),
        )
    done = len(keys.wanted) - len(_minus(keys.wanted, keys.seen))
    notes = []
    rejected = len(keys.rejected) - len(_minus(keys.rejected, keys.wanted))
    if rejected:
        notes.append(f"{rejected} rejected by the server")
    if aside.causes:
        notes.append(f"set aside unsent: {aside.summary()}")
    if turns_cut:
        notes.append("turns not sent: " + ", ".join(f"{n} {cause}" for cause, n in sorted(turns_cut.items())))
    note = f" ({'; '.join(notes)}; listed in rejects.jsonl)" if notes else ""
    return CheckResult(
        name=COMPLETENESS,
        passed=True,
        total=len(keys.wanted),
        verdict=f"every dataset id has its records exactly once: {done}/{len(keys.wanted)}{note}",
    )


@dataclass
class TurnCounts:
    """Records and flagged records by turn (regenerated conversations: verify reports each turn apart)."""

    records: Counter[int] = field(default_factory=Counter)
    flagged: Counter[int] = field(default_factory=Counter)

    def add(self, turns: list[int], flags: Any) -> None:
        import numpy as np

        self.records.update(turns)
        clean = np.asarray([not combo for combo in flags.combos], bool)
        if len(turns) and not clean[flags.combo_of_row].all():
            self.flagged.update(t for t, ok in zip(turns, clean[flags.combo_of_row].tolist(), strict=True) if not ok)


def conversations_check(turns: TurnCounts, cut: Mapping[str, int], conversations: int, ended: int) -> CheckResult:
    """What a regenerated output holds, turn by turn and conversation by conversation (informational: each rule it
    sums is judged by its own check)."""
    shown = by_turn_words(turns.records, turns.flagged)
    ends = ", ".join(f"{count} {cause}" for cause, count in sorted(cut.items()))
    whole = f"{conversations - ended}/{conversations} conversations" if conversations else "conversations"
    verdict = f"{whole} have every planned turn; records by turn: {shown or 'none'}"
    if ended:
        verdict += f"; {ended} ended early, turns not sent: {ends} (rejects.jsonl, docs/regenerate.md)"
    return CheckResult(name=CONVERSATIONS, passed=True, total=sum(turns.records.values()), verdict=verdict)


def output_counts(
    records: Counts,
    server: Mapping[Key, Mapping[str, Any]],
    prompts: int,
    set_aside: SetAside,
) -> Counts:
    """The whole output's counts, each cause apart: server refusals (HTTP 4xx) and server failures (a 5xx
    listed in rejects.jsonl) from the server entries, the prompts set aside by cause from the set-aside
    accounting. `prompts`: the dataset's valid prompts, or without the dataset the prompts the output names
    (records, server entries, set aside); `lines` adds the dataset's lines that are not prompts."""
    failed = sum(1 for entry in server.values() if int(entry.get("status") or 0) >= 500)
    counts = records + Counts(refused=len(server) - failed, failed=failed, set_aside=dict(set_aside.causes))
    counts.lines = prompts + sum(set_aside.causes.values()) - len(set_aside.prompts)
    return counts
