"""`datagen verify OUTPUT_DIR`: every check over a finished (or running) output, as a report a person reads.

Flags are recomputed from the stored token ids (the worker's own flags are not trusted), completeness is
keyed by (id, sample, turn), prompt fidelity re-renders a sample of prompts with the recorded tokenizer and
template (for regenerated conversations every turn of the sampled ones, from the run's own recorded answers),
and the manifest's Parquet checksums are re-hashed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.commands import VerifyCommand
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.paths import on_this_machine
from datagen_operator.api.progress import Counts
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import ChecksSpec, DataGenRunSpec, DatasetSample
from datagen_operator.api.status import CheckResult
from datagen_operator.api.step_program import add_shared_arguments, add_trust_remote_code, write_verdict
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import by_turn_words, check_context, evaluate
from datagen_operator.checks.fidelity import conversation_fidelity, line_fidelity
from datagen_operator.checks.record_columns import COLUMNS, batch_flags
from datagen_operator.checks.samples import SampleComparison, compared_samples, samples_compared
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.output.fingerprint import fingerprint_history_reasoning
from datagen_operator.output.layout import Key, OutputLayout
from datagen_operator.output.records import TURNS_KIND
from datagen_operator.prompts.draws import VariableDraws, variable_draws

COMPLETENESS = "completeness"
CONVERSATIONS = "conversations"
INTEGRITY = "integrity"
DATASET_PIN = "dataset_pin"
EXAMPLES_PER_FLAG = 3
CONTEXT_TOKENS = 12
"""Tokens shown on each side of the think boundary in an example."""


@dataclass
class Example:
    id: str
    sample: int
    flag: str
    excerpt: str


@dataclass
class VerifyReport:
    output: str
    counts: Counts
    """The whole output's counts, as the run's status.progress holds them: records, server refusals, prompts set
    aside by cause (from rejects.jsonl), requests out of attempts."""
    checks: list[CheckResult]
    examples: list[Example] = field(default_factory=list)
    fingerprint_sha256: str | None = None
    expectations: rc.Expectations | None = None
    """What the records were judged by (where reasoning ends): the HTML report's lengths use the same."""

    @property
    def records(self) -> int:
        return self.counts.records

    @property
    def set_aside(self) -> dict[str, int]:
        """cause -> dataset lines or prompts set aside unsent (listed in rejects.jsonl)."""
        return self.counts.set_aside

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def outcome(self) -> StepOutcome:
        failed = [c for c in self.checks if not c.passed]
        if failed:
            return StepOutcome(
                False,
                Reason.VERIFICATION_FAILED,
                "; ".join(f"{c.name}: {c.verdict}" for c in failed),
                tuple(self.checks),
            )
        return StepOutcome(
            True,
            Reason.VERIFIED,
            f"{plural(len(self.checks), 'check')} {agrees(len(self.checks), 'passes', 'pass')} over {plural(self.records, 'record')}",
            tuple(self.checks),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "passed": self.passed,
            "records": self.records,
            "fingerprint_sha256": self.fingerprint_sha256,
            "checks": [c.model_dump(mode="json") for c in self.checks],
            "examples": [e.__dict__ for e in self.examples],
            "set_aside": dict(self.set_aside),
            "counts": self.counts.for_storage(),
        }


def excerpt(tokenizer: Any, input_ids: list[int], output_ids: list[int], think_end_id: int | None) -> str:
    """The prompt's tail and the output around the think end, decoded with special tokens SHOWN."""
    if tokenizer is None:
        return f"prompt tail ids {input_ids[-CONTEXT_TOKENS:]} | output ids {output_ids[: 2 * CONTEXT_TOKENS]}"
    tail = tokenizer.decode(input_ids[-CONTEXT_TOKENS:], skip_special_tokens=False)
    if think_end_id is not None and think_end_id in output_ids:
        at = output_ids.index(think_end_id)
        around = output_ids[max(0, at - CONTEXT_TOKENS) : at + CONTEXT_TOKENS]
        body = tokenizer.decode(around, skip_special_tokens=False)
        prefix = "…" if at > CONTEXT_TOKENS else ""
    else:
        body = tokenizer.decode(output_ids[: 2 * CONTEXT_TOKENS], skip_special_tokens=False)
        prefix = ""
    suffix = (
        tokenizer.decode(output_ids[-4:], skip_special_tokens=False) if len(output_ids) > 2 * CONTEXT_TOKENS else ""
    )
    return f"…{tail!r} ⟶ {prefix}{body!r}" + (f" … {suffix!r}" if suffix else "")


def _integrity(output: Path, manifest: dict[str, Any] | None) -> CheckResult:
    from datagen_operator.output.layout import sha256_file

    if manifest is None:
        return CheckResult(name=INTEGRITY, passed=False, verdict="no manifest.json: this is not a datagen output dir")
    bad: list[str] = []
    shards = manifest.get("shards", {})
    checked = 0
    for index, entry in sorted(shards.items()):
        if "parquet" not in entry:
            continue
        checked += 1
        path = output / entry["parquet"]
        if not path.exists():
            bad.append(f"shard {index}: {entry['parquet']} missing")
        elif sha256_file(path) != entry.get("parquet_sha256"):
            bad.append(f"shard {index}: {entry['parquet']} changed since it was written (sha256 differs)")
    if bad:
        return CheckResult(name=INTEGRITY, passed=False, count=len(bad), total=checked, verdict="; ".join(bad))
    return CheckResult(
        name=INTEGRITY,
        passed=True,
        total=checked,
        verdict=f"{plural(checked, 'Parquet shard checksum')} {agrees(checked, 'matches', 'match')} the manifest",
    )


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


def _completeness(
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


def _dataset_pin(
    pin: Any, records: PinCheck, dataset: Path | None, declared: Any, id_field: str | None = None
) -> CheckResult:
    """The output came from one dataset (prompts/pin.py): every record's prompt hash equals the pinned hash of its
    line, and the dataset file (when given) is still the pinned one (its sha256; every line named when it is not)."""
    from datagen_operator.prompts.pin import changed_message, dataset_changes

    if pin is None:
        return CheckResult(name=DATASET_PIN, passed=True, verdict="no dataset pin in the output (nothing to hold)")
    problems = []
    if records.differ:
        problems.append(
            f"{records.differ}/{records.checked} records were generated from prompts that are not the pinned "
            f"dataset's lines (e.g. {', '.join(records.examples)}): the dataset changed under the run; regenerate "
            "them into a new spec.output.path"
        )
    if dataset is not None:
        changes = dataset_changes(dataset, declared, pin, id_field=id_field)
        if changes is not None:
            problems.append(changed_message(dataset, changes))
    if problems:
        return CheckResult(
            name=DATASET_PIN, passed=False, count=max(1, records.differ), total=records.checked,
            verdict="; ".join(problems),
        )  # fmt: skip
    return CheckResult(
        name=DATASET_PIN, passed=True, total=records.checked,
        verdict=f"{records.checked} records' prompts are the pinned dataset's lines (sha256 {pin.sha256[:12]})",
    )  # fmt: skip


def _loaded_from(tokenizer: Any) -> Path | None:
    """The directory a transformers tokenizer was loaded from (its model directory, for config eos ids)."""
    where = getattr(tokenizer, "name_or_path", None)
    return Path(where) if isinstance(where, str) and where and Path(where).is_dir() else None


def verify_output(
    output: Path,
    spec: DataGenRunSpec | None,
    *,
    tokenizer: Any = None,
    dataset: Path | None = None,
    fidelity: bool = True,
    model_dir: Path | None = None,
) -> VerifyReport:
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.output.readers import RecordBatches, iter_rejects
    from datagen_operator.prompts.render import Renderer, template_variables

    manifest = read_manifest(output)
    resolved: ResolvedModel | None = resolve_model(spec) if spec is not None else None
    fingerprint = (manifest or {}).get("fingerprint", {})
    thinking = resolved.thinking if resolved else bool(fingerprint.get("thinking"))
    expect = None
    if resolved is not None and (tokenizer is not None or resolved.preset is not None):
        config_dir = model_dir
        if config_dir is None and spec is not None:
            config_dir = model_config_dir(spec.model.path, _loaded_from(tokenizer))
        expect = rc.expectations_for(resolved, tokenizer, config_dir)
        if tokenizer is None:
            # No tokenizer to read SGLang's stop set from: every request sent it (the fingerprint's sampling).
            sent = (fingerprint.get("sampling") or {}).get("stop_token_ids") or ()
            stops = expect.stop_token_ids | {i for i in sent if isinstance(i, int)}
            expect = dataclasses.replace(expect, stop_token_ids=stops)
    if expect is None:
        raise ValueError("cannot tell what faithful records look like: pass --run RUN.yaml (and --tokenizer)")
    samples = spec.generation.samples_per_prompt if spec else int(fingerprint.get("samples_per_prompt", 1))
    turns_mode = spec.generation.turns if spec else str(fingerprint.get("turns", "last"))
    thresholds = spec.checks if spec else ChecksSpec()
    # The subset and the variables drawn are the spec's (OUTPUT/run.yaml's, for `datagen verify OUTPUT`): the
    # records wanted are the subset's lines only, each judged by its own draw.
    sample = spec.dataset.sample if spec else None
    draws = variable_draws(spec.generation.template_variable_mix if spec else None)
    compared = compared_samples(spec) if spec else samples_compared(fingerprint.get("sampling") or {}, samples)

    from datagen_operator.prompts.dataset import ShardScan

    dataset_path = dataset or (Path(spec.dataset.path) if spec else None)
    if dataset_path is not None and not dataset_path.exists():
        dataset_path = None
    # One streamed pass over the records and one over the dataset; what is kept per record is its key's
    # 64-bit hash (KeyCheck), so memory does not grow with the record's tokens nor with Python objects.
    from datagen_operator.prompts.pin import read_pin

    pin = read_pin(output)
    pins = PinCheck(pin.line_hashes if pin is not None else None)
    read = _read_records(
        RecordBatches(output, (*COLUMNS, "cached_tokens", "line", "prompt_hash", "turn")),
        pins,
        expect,
        tokenizer,
        fidelity_size=thresholds.fidelity_sample if fidelity else 0,
        name_prompts=dataset_path is None,
        compared_samples=compared,
    )
    counts, reservoir, duplicates = read.counts, read.fidelity_sample, read.duplicates
    keys = KeyCheck(seen=read.keys)
    all_rejects = list(iter_rejects(output))
    server = {
        (r["id"], r.get("sample", 0), r.get("turn") or 0): r
        for r in all_rejects
        if r.get("kind") == "server" and r.get("id")
    }
    cut = turns_cut_keys(all_rejects)

    prompts: dict[str, Any] = {}
    dataset_prompts: list[tuple[int, str]] | None = None
    dataset_causes: list[str] | None = None
    dataset_count: int | None = None
    planned: dict[str, int] = {}
    """id -> answers planned, for the prompts set aside unsent."""
    if dataset_path is not None:
        # Only lines with a rejects.jsonl entry can be set aside; every other valid prompt is just counted.
        reject_lines = {entry.get("line") for entry in all_rejects if str(entry.get("key", "")).startswith("line:")}
        scanned = _read_dataset(
            ShardScan(
                dataset_path,
                0,
                1,
                spec.dataset.format if spec else "auto",
                id_field=spec.dataset.id_field if spec else None,
                sample=sample,
            ),
            samples,
            reject_lines,
            {r["id"] for r in reservoir},
            turns_mode,
            draws,
        )
        keys.wanted, prompts, planned = scanned.wanted, scanned.sampled, scanned.turns
        dataset_prompts, dataset_causes, dataset_count = scanned.on_reject_lines, scanned.causes, scanned.prompts
    set_aside = account_set_aside(dataset_prompts, dataset_causes, all_rejects)
    keys.rejected = key_hashes(server)
    keys.unsent = key_hashes(
        [
            *((prompt_id, s, t) for prompt_id in set_aside.prompts for s in range(samples)
              for t in range(planned.get(prompt_id, 1))),
            *cut,
        ]
    )  # fmt: skip
    if keys.wanted is not None:
        _name_examples(
            keys,
            output,
            dataset_path,
            spec.dataset.format if spec else "auto",
            samples,
            turns_mode,
            spec.dataset.id_field if spec else None,
            sample,
        )
    if dataset_count is None:
        named = read.prompts | {hash(key[0]) for key in server} | {hash(i) for i in set_aside.prompts}
        prompts_named = len(named)
    else:
        prompts_named = dataset_count
    counts = _output_counts(counts, server, prompts_named, set_aside)
    ctx = check_context(resolved, thresholds, expect.think_end_id, thinking=thinking, preset=fingerprint.get("preset"))
    checks = [_integrity(output, manifest), *evaluate(counts, ctx)]
    checks.append(_completeness(keys, duplicates, set_aside, turns_cut_causes(all_rejects)))
    if turns_mode == "all":
        ended = {(r["id"], r.get("sample", 0)) for r in all_rejects if r.get("kind") == TURNS_KIND}
        conversations = (dataset_count if dataset_count is not None else prompts_named) * samples
        checks.append(conversations_check(read.by_turn, turns_cut_causes(all_rejects), conversations, len(ended)))
    checks.append(
        _dataset_pin(
            pin, pins, dataset_path, spec.dataset.format if spec else "auto", spec.dataset.id_field if spec else None
        )
    )
    if fidelity:
        rendered_on = pin.rendered_on if pin is not None else None
        variables = template_variables(resolved, rendered_on) if resolved is not None else None
        renderer = Renderer(tokenizer, variables) if tokenizer is not None and variables is not None else None
        # What history the output's requests sent: the run's choice, or the output's own record of it.
        history = spec.generation.history_reasoning if spec else fingerprint_history_reasoning(fingerprint)
        if turns_mode == "all":
            checks.append(conversation_fidelity(output, reservoir, prompts, renderer, resolved, variables, history))
        else:
            checks.append(line_fidelity(reservoir, prompts, renderer, history))
    flat_examples = [e for flag in sorted(read.examples) for e in read.examples[flag]]
    return VerifyReport(
        str(output), counts, checks, flat_examples, (manifest or {}).get("fingerprint_sha256"), expectations=expect
    )


def stored_record_counts(output: Path, expect: rc.Expectations, compared_samples: int = 0) -> Counts:
    """The flags of every record the output holds (Parquet and segments, exactly once), checked in columns as
    verify checks them, and its prompts' samples compared when `compared_samples` (checks.samples) is 2 or
    more: what the preflight judges an output by before a resume."""
    from datagen_operator.output.readers import RecordBatches

    counts = Counts()
    comparison = SampleComparison(compared_samples) if compared_samples > 1 else None
    for batch in RecordBatches(output, (*COLUMNS, "cached_tokens", "turn")):
        counts.merge(_batch_counts(batch, batch_flags(batch, expect).counts()))
        if comparison is not None:
            _compare_samples(batch, comparison)
    return counts + _compared(comparison)


def _compare_samples(batch: Any, comparison: SampleComparison) -> None:
    """Each first-turn record's output ids, as bytes, to `comparison` (no Python list per record)."""
    import numpy as np
    import pyarrow.compute as pc

    outputs = batch.column("output_ids")
    ends = np.cumsum(pc.list_value_length(outputs).fill_null(0).to_numpy(zero_copy_only=False))
    flat = pc.list_flatten(outputs).to_numpy(zero_copy_only=False)
    turns = batch.column("turn").fill_null(0).to_numpy(zero_copy_only=False)
    start = 0
    for prompt_id, end, turn in zip(batch.column("id").to_pylist(), ends.tolist(), turns.tolist(), strict=True):
        if turn == 0:
            comparison.add(prompt_id, flat[start:end].tobytes())
        start = end


def _compared(comparison: SampleComparison | None) -> Counts:
    if comparison is None:
        return Counts()
    comparison.close()
    return comparison.counts()


def _batch_counts(batch: Any, flags: Counter[str]) -> Counts:
    """Counts.add over a batch: token counts are list lengths, a missing cached count is 0."""
    import pyarrow.compute as pc

    def total(values: Any) -> int:
        return int(pc.sum(values).as_py() or 0)

    return Counts(
        records=batch.num_rows,
        tool_records=total(batch.column("has_tools").cast("int64")),
        prompt_tokens=total(pc.list_value_length(batch.column("input_ids"))),
        output_tokens=total(pc.list_value_length(batch.column("output_ids"))),
        cached_tokens=total(batch.column("cached_tokens")),
        flags=flags,
    )


class _FidelitySample:
    """A uniform sample of `size` records without replacement (the `size` smallest of a random key per
    record, drawn from a fixed seed in record order: the same report for the same output, however it is
    batched); only the sampled records' ids and input_ids become Python objects."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.size = size
        self._rng = np.random.default_rng(0)
        self._kept: list[tuple[float, dict[str, Any]]] = []

    def offer(self, batch: Any) -> None:
        import numpy as np

        if not self.size:
            return
        keys = self._rng.random(batch.num_rows)
        bound = self._kept[-1][0] if len(self._kept) >= self.size else 2.0
        rows = np.flatnonzero(keys < bound)
        rows = rows[np.argsort(keys[rows], kind="stable")[: self.size]]
        if not len(rows):
            return
        chosen = batch.select(["id", "sample", "turn", "input_ids"]).take(rows).to_pylist()
        self._kept = sorted([*self._kept, *zip(keys[rows].tolist(), chosen, strict=True)], key=lambda kept: kept[0])
        del self._kept[self.size :]

    def records(self) -> list[dict[str, Any]]:
        return [record for _, record in self._kept]


@dataclass
class _RecordsPass:
    records: int
    counts: Counts
    keys: Any
    """np.ndarray: the records' key hashes, unique, sorted."""
    duplicates: int
    """Rows repeating an earlier (id, sample, turn): a shard's Parquet rows, and a key two shards stored (a chunk
    generated by two workers, output/steal.py)."""
    examples: dict[str, list[Example]]
    fidelity_sample: list[dict[str, Any]]
    prompts: set[int]
    """hash(id) of the prompts the records name (only when asked: counted without the dataset)."""
    by_turn: TurnCounts = field(default_factory=lambda: TurnCounts())


@dataclass
class PinCheck:
    """Every record's `prompt_hash` against the pinned hash of its dataset line (prompts/pin.py)."""

    pinned: Any
    """np.ndarray of line hashes, or None (no pin)."""
    checked: int = 0
    differ: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, batch: Any) -> None:
        import numpy as np

        if self.pinned is None:
            return
        # A record names its line 1-based (prompts.dataset.line_number); the pin is indexed from 0.
        lines = batch.column("line").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64) - 1
        hashes = batch.column("prompt_hash").fill_null(0).to_numpy(zero_copy_only=False).astype(np.uint64)
        inside = (lines >= 0) & (lines < len(self.pinned))
        pinned = np.zeros(len(lines), np.uint64)
        pinned[inside] = self.pinned[lines[inside]]
        bad = np.flatnonzero(~inside | (pinned != hashes))
        self.checked += len(lines)
        self.differ += len(bad)
        if len(bad) and len(self.examples) < 5:
            ids = batch.column("id").take(bad[: 5 - len(self.examples)]).to_pylist()
            self.examples += [f"{i!r} (line {int(lines[b]) + 1})" for i, b in zip(ids, bad.tolist(), strict=False)]


def _read_records(
    batches: Any,
    pins: PinCheck,
    expect: rc.Expectations,
    tokenizer: Any,
    *,
    fidelity_size: int,
    name_prompts: bool,
    compared_samples: int = 0,
) -> _RecordsPass:
    """One pass over the records (RecordBatches), checked in columns (record_columns); the samples of each
    prompt compared when `compared_samples` is 2 or more (checks.samples)."""
    import numpy as np

    counts = Counts()
    comparison = SampleComparison(compared_samples) if compared_samples > 1 else None
    record_keys = array("q")
    prompts: set[int] = set()
    examples: dict[str, list[Example]] = defaultdict(list)
    fidelity_sample = _FidelitySample(fidelity_size)
    by_turn = TurnCounts()
    for batch in batches:
        ids = batch.column("id").to_pylist()
        turns = batch.column("turn").fill_null(0).to_pylist()
        record_keys.extend(map(hash, zip(ids, batch.column("sample").to_pylist(), turns, strict=True)))
        if name_prompts:
            prompts.update(map(hash, ids))
        flags = batch_flags(batch, expect)
        counts.merge(_batch_counts(batch, flags.counts()))
        by_turn.add(turns, flags)
        pins.add(batch)
        for flag in sorted(flags.counts()):
            wanted = EXAMPLES_PER_FLAG - len(examples[flag])
            if wanted > 0:
                for r in batch.take(flags.rows_with(flag)[:wanted]).to_pylist():
                    text = excerpt(tokenizer, r["input_ids"], r["output_ids"], expect.think_end_id)
                    examples[flag].append(Example(r["id"], r["sample"], flag, text))
        fidelity_sample.offer(batch)
        if comparison is not None:
            _compare_samples(batch, comparison)
    counts = counts + _compared(comparison)
    keys = sorted_unique(np.frombuffer(record_keys, dtype=np.int64))
    # A shard's own repeats are dropped by the reader (counted there); what repeats across shards is counted here.
    duplicates = batches.duplicates + len(record_keys) - len(keys)
    return _RecordsPass(
        len(record_keys), counts, keys, duplicates, examples, fidelity_sample.records(), prompts, by_turn
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


@dataclass
class _DatasetPass:
    prompts: int
    """Valid prompts."""
    wanted: Any
    """np.ndarray: the key hashes of every valid prompt x sample, unique, sorted."""
    causes: list[str]
    """The cause of every line set aside when read."""
    on_reject_lines: list[tuple[int, str]]
    """(line number, id) of the valid prompts on lines that rejects.jsonl names."""
    sampled: dict[str, Any]
    """id -> Prompt for the ids asked for (the fidelity sample)."""
    turns: dict[str, int] = field(default_factory=dict)
    """id -> answers planned, for the prompts on lines that rejects.jsonl names."""


def _read_dataset(
    scan: Any, samples: int, reject_lines: set[Any], sampled_ids: set[str], turns_mode: str = "last",
    draws: VariableDraws | None = None,
) -> _DatasetPass:  # fmt: skip
    """One pass over the dataset (a ShardScan of the whole of it); keys hashed a chunk at a time."""
    import numpy as np

    from datagen_operator.prompts.conversation import planned_turns
    from datagen_operator.prompts.dataset import MalformedLine, line_number, prompt_from

    ids: list[str] = []
    turns: list[int] = []
    chunks: list[Any] = []
    one_turn = turns_mode != "all"
    """One answer a line: every key's turn is 0 (the loop below then keeps only the ids)."""

    def hash_chunk() -> None:
        for sample in range(samples):
            keys = zip(ids, repeat(sample), repeat(0) if one_turn else turns)
            chunks.append(np.fromiter(map(hash, keys), np.int64, len(ids)))
        ids.clear()
        turns.clear()

    result = _DatasetPass(0, None, [], [], {})
    add_id, malformed = ids.append, MalformedLine
    # This loop runs once per dataset line: what only some lines need is asked only when any line can.
    for item in scan:
        if type(item) is malformed:
            result.causes.append(item.cause)
            continue
        ref, obj = item
        result.prompts += 1
        planned = 1
        if one_turn:
            add_id(ref.id)
        else:
            planned = planned_turns(prompt_from(ref, obj).messages, turns_mode)
            ids.extend(repeat(ref.id, planned))
            turns.extend(range(planned))
        if len(ids) >= 65_536:
            hash_chunk()
        if reject_lines and line_number(ref.position) in reject_lines:
            result.on_reject_lines.append((line_number(ref.position), ref.id))
            result.turns[ref.id] = planned
        if ref.id in sampled_ids:
            result.sampled[ref.id] = prompt_from(ref, obj, draws)
    hash_chunk()
    result.wanted = sorted_unique(np.concatenate([np.zeros(0, np.int64), *chunks]))
    return result


def _output_counts(
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


def _name_examples(
    keys: KeyCheck,
    output: Path,
    dataset: Path | None,
    fmt: Any,
    samples: int,
    turns_mode: str = "last",
    id_field: str | None = None,
    sample: DatasetSample | None = None,
) -> None:
    """The first few missing and extra keys by name: a second pass, only when there are any."""
    import heapq

    from datagen_operator.output.readers import RecordBatches
    from datagen_operator.prompts.conversation import planned_turns
    from datagen_operator.prompts.dataset import MalformedLine, ShardScan, prompt_from

    missing, extra = set(keys.missing().tolist()), set(keys.extra().tolist())
    if missing and dataset is not None:
        found = (
            (item[0].id, s, t)
            for item in ShardScan(dataset, 0, 1, fmt, id_field=id_field, sample=sample)
            if not isinstance(item, MalformedLine)
            for s in range(samples)
            for t in range(planned_turns(prompt_from(*item).messages, turns_mode))
        )
        keys.missing_examples = heapq.nsmallest(3, (k for k in found if hash(k) in missing))
    if extra:
        found = (
            key
            for batch in RecordBatches(output, ())
            for key in zip(
                batch.column("id").to_pylist(),
                batch.column("sample").to_pylist(),
                batch.column("turn").fill_null(0).to_pylist(),
                strict=True,
            )
        )
        keys.extra_examples = heapq.nsmallest(3, (k for k in found if hash(k) in extra))


def render_report(report: VerifyReport, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 140))
    verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
    console.print(f"\n[bold]datagen verify[/] {report.output}: {plural(report.records, 'record')} — {verdict}")
    if report.fingerprint_sha256:
        console.print(f"fingerprint sha256 {report.fingerprint_sha256[:16]}…")
    table = Table(show_lines=False)
    for column in ("check", "result", "rate", "threshold", "bound", "count/total", "verdict"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        table.add_row(
            c.name,
            "[green]pass[/]" if c.passed else "[red]FAIL[/]",
            "-" if c.rate is None else f"{c.rate:.2%}",
            "-" if c.threshold is None else f"{c.threshold:.2%}",
            "-" if c.bound is None else f"{c.bound:.2%}",
            f"{c.count}/{c.total}",
            c.verdict,
        )
    console.print(table)
    if report.set_aside:
        causes = ", ".join(f"{cause} {count}" for cause, count in sorted(report.set_aside.items()))
        console.print(f"set aside, never sent (reasons in shards/*/rejects.jsonl): {causes}")
    if report.examples:
        examples = Table(title="examples (special tokens shown)", show_lines=True)
        for column in ("flag", "id#sample", "prompt tail ⟶ output around the think end"):
            examples.add_column(column, overflow="fold")
        for e in report.examples:
            examples.add_row(e.flag, f"{e.id}#{e.sample}", e.excerpt)
        console.print(examples)


def holds_records(output: Path) -> bool:
    """A manifest, a shard's segment or a compacted Parquet file: something the checks can judge."""
    layout = OutputLayout(output)
    return (
        layout.manifest.exists()
        or any(layout.data_dir.glob("shard-*.parquet"))
        or any(layout.shards_dir.glob("*/segment-*.jsonl"))
    )


def nothing_to_verify(output: Path) -> tuple[str, int] | None:
    """One line saying what OUTPUT is when it holds no record, and the exit code; None when the checks apply.
    A run halted before its workers (a parser mismatch, a failed canary) leaves run.yaml, the dataset pin and
    logs: a table of checks over zero records would only repeat "missing" for each prompt."""
    if holds_records(output):
        return None
    run_file = OutputLayout(output).run_file
    if run_file.exists():
        name = _run_name(run_file)
        # Only files that exist are named: a run halted at the preflight started no server, so it has no logs.
        logs = f"; server logs in {OutputLayout(output).logs}" if OutputLayout(output).logs.is_dir() else ""
        return (
            f"{output}: the output of DataGenRun {name}, with no record in it: the run stopped (or has not yet "
            "started its workers) before any was written, so there is nothing to verify; why it stopped is its "
            f"Succeeded condition (`kubectl describe dgr {name}`, or the `datagen run` log{logs})",
            EXIT_FAILED_VERDICT,
        )
    line = (
        f"{output}: not a datagen output: no manifest.json, run.yaml, shards/ or data/ in it (a run writes them "
        "in its spec.output.path)"
    )
    # `datagen verify out` for `out/quickstart`: name the outputs one level down.
    inside = sorted(
        d.name for d in output.iterdir() if d.is_dir() and (OutputLayout(d).run_file.exists() or holds_records(d))
    )
    if inside:
        line += f"; the outputs in it: {', '.join(inside[:5])}" + (", ..." if len(inside) > 5 else "")
    return line, EXIT_BAD_INPUT


def _run_name(run_file: Path) -> str:
    import yaml

    try:
        document = yaml.safe_load(run_file.read_text()) or {}
        return str(document.get("metadata", {}).get("name") or "?")
    except (OSError, yaml.YAMLError, AttributeError):
        return "?"


def load_run_spec(output: Path, run_file: Path | None = None) -> DataGenRunSpec | None:
    """The run's spec (--run, else OUTPUT/run.yaml; None when there is none) with its paths as this machine
    reads them: a local run's relative paths against its manifest's folder; a cluster run's (volumes named)
    left as written, for on_this_machine to place."""
    from datagen_operator.api import anchor_paths, load_run

    run_file = run_file or OutputLayout(output).run_file
    if not run_file.exists():
        return None
    run = load_run(run_file)
    if run.spec.output.volume is not None or run.spec.dataset.volume is not None:
        return run.spec
    return anchor_paths(run, run_file.resolve().parent).spec


@dataclass(frozen=True)
class HostVerification:
    report: VerifyReport
    notes: list[str]
    """Why a check could not use the run's own paths here (a pod's path), and the flag that fills in."""


def verify_here(
    output: Path,
    run_file: Path | None = None,
    *,
    tokenizer_dir: str | None = None,
    dataset: str | None = None,
    trust_remote_code: bool = False,
    fidelity: bool | None = True,
) -> HostVerification:
    """`datagen verify` on this machine (also export's gate). Raises ValueError with the one line to show.
    `fidelity=None`: re-render prompts when the tokenizer and the dataset are both found here. `run_file`: the
    run's manifest (default OUTPUT/run.yaml)."""
    from datagen_operator.api import SpecError

    run_file = run_file or OutputLayout(output).run_file
    try:
        spec = load_run_spec(output, run_file)
    except SpecError as error:
        raise ValueError(f"{run_file}: {error}") from error
    notes: list[str] = []
    dataset_path = Path(dataset) if dataset else None
    if dataset_path is None and spec is not None:
        dataset_path, notes = on_this_machine(spec, output)
    tokenizer = None
    directory = tokenizer_dir or (spec.model.tokenizer_dir if spec else None)
    if directory and Path(directory).is_dir():
        from datagen_operator.prompts.render import load_tokenizer

        trust = trust_remote_code or (resolve_model(spec).trust_remote_code if spec else False)
        try:
            tokenizer = load_tokenizer(directory, trust_remote_code=trust)
        except ValueError as error:  # e.g. remote code without --trust-remote-code: say so, no traceback
            raise ValueError(f"tokenizer {directory}: {error}") from error
    elif directory:
        field = spec.model.tokenizer_field if spec else "spec.model.path"
        notes.append(f"{field} {directory} is not a directory here: pass --tokenizer DIR (the model directory)")
    if fidelity is None:
        fidelity = tokenizer is not None and dataset_path is not None
    report = verify_output(output, spec, tokenizer=tokenizer, dataset=dataset_path, fidelity=fidelity)
    return HostVerification(report, notes)


def verify_as_asked(output: Path, args: argparse.Namespace, *, fidelity: bool | None) -> HostVerification:
    """verify_here with what a step program's shared arguments asked for (--run, --tokenizer, --dataset,
    --trust-remote-code): `datagen verify`, and `datagen export`'s gate."""
    return verify_here(
        output,
        Path(args.run) if args.run else None,
        tokenizer_dir=args.tokenizer,
        dataset=args.dataset,
        trust_remote_code=args.trust_remote_code,
        fidelity=fidelity,
    )


def build_parser() -> argparse.ArgumentParser:
    """`datagen verify`'s arguments; what the shells pass is api/commands.py's VerifyCommand."""
    parser = argparse.ArgumentParser(prog="datagen verify", description="Check an output directory for faithfulness.")
    add_shared_arguments(
        parser,
        VerifyCommand,
        run="the DataGenRun manifest (default: OUTPUT/run.yaml if present)",
        dataset="dataset file (default: the run's dataset path; for a cluster output, that path on the output's "
        "volume, found from OUTPUT)",
    )
    add_trust_remote_code(parser)
    parser.add_argument("--no-fidelity", action="store_true", help="skip re-rendering prompts")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report with plots here")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    output = Path(args.output)
    if not output.is_dir():
        print(f"error: {output}: not a directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    empty = nothing_to_verify(output)
    if empty is not None:
        line, code = empty
        if args.json:
            sys.stdout.write(orjson.dumps({"passed": False, "records": 0, "verdict": line}).decode() + "\n")
        else:
            print(line)
        write_verdict(StepOutcome(False, Reason.NO_RECORDS, line), args.termination_log, echo=False)
        return code
    try:
        verified = verify_as_asked(output, args, fidelity=not args.no_fidelity)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = verified.report
    if args.json:
        sys.stdout.write(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for note in verified.notes:
            print(f"note: {note}")
        render_report(report)
    if args.html:
        from datagen_operator.checks.report_html import write_html_report

        print(f"HTML report: {args.html} ({write_html_report(Path(args.html), report)} bytes)", file=sys.stderr)
    return write_verdict(report.outcome(), args.termination_log, echo=False)
