"""What `datagen verify` reads besides its record pass (checks/record_pass.py): the dataset in one pass (the keys
wanted, the prompts of the fidelity sample, the lines rejects.jsonl names), a second pass naming a few missing and
extra keys, the Parquet files against the manifest's checksums, the dataset file against its pin, and the flags of
every stored record for the preflight (stored_record_counts).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.progress import Counts
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.completeness import KeyCheck, sorted_unique
from datagen_operator.checks.fidelity import CONVERSATION_COLUMNS, Conversations
from datagen_operator.checks.record_columns import COLUMNS
from datagen_operator.checks.record_pass import PinCheck, record_counts
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.draws import VariableDraws

INTEGRITY = "integrity"
DATASET_PIN = "dataset_pin"


def integrity(output: Path, manifest: dict[str, Any] | None) -> CheckResult:
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


def dataset_pin(pin: Any, records: PinCheck, dataset: DatasetRef | None) -> CheckResult:
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
        changes = dataset_changes(dataset, pin)
        if changes is not None:
            problems.append(changed_message(dataset.path, changes))
    if problems:
        return CheckResult(
            name=DATASET_PIN, passed=False, count=max(1, records.differ), total=records.checked,
            verdict="; ".join(problems),
        )  # fmt: skip
    return CheckResult(
        name=DATASET_PIN, passed=True, total=records.checked,
        verdict=f"{records.checked} records' prompts are the pinned dataset's lines (sha256 {pin.sha256[:12]})",
    )  # fmt: skip


@dataclass
class DatasetPass:
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


def read_dataset(
    scan: Any, samples: int, reject_lines: set[Any], sampled_ids: set[str], turns_mode: str = "last",
    draws: VariableDraws | None = None,
) -> DatasetPass:  # fmt: skip
    """One pass over the dataset (a ShardScan of the whole of it); keys hashed a chunk at a time."""
    import numpy as np

    from datagen_operator.prompts.conversation import planned_turns
    from datagen_operator.prompts.lines import MalformedLine, line_number, prompt_from

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

    result = DatasetPass(0, None, [], [], {})
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


def name_examples(
    keys: KeyCheck, output: Path, dataset: DatasetRef | None, samples: int, turns_mode: str = "last"
) -> None:
    """The first few missing and extra keys by name: a second pass, only when there are any."""
    import heapq

    from datagen_operator.output.readers import RecordBatches
    from datagen_operator.prompts.conversation import planned_turns
    from datagen_operator.prompts.lines import MalformedLine, prompt_from
    from datagen_operator.prompts.scan import ShardScan

    missing, extra = set(keys.missing().tolist()), set(keys.extra().tolist())
    if missing and dataset is not None:
        found = (
            (item[0].id, s, t)
            for item in ShardScan(dataset, 0, 1)
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


def stored_record_counts(output: Path, expect: rc.Expectations, compared_samples: int = 0) -> Counts:
    """The flags of every record the output holds (Parquet and segments, exactly once), checked in columns as
    verify checks them, and its prompts' samples compared when `compared_samples` (checks.samples) is 2 or
    more: what the preflight judges an output by before a resume."""
    from datagen_operator.output.readers import RecordBatches

    return record_counts(RecordBatches(output, (*COLUMNS, "cached_tokens", "turn")), expect, compared_samples)


def conversation_records(output: Path, wanted: set[tuple[str, int]]) -> Conversations:
    """The sampled conversations' records in turn order (checks/fidelity.conversation_fidelity judges them), in one
    pass over the output."""
    from datagen_operator.output.readers import RecordBatches

    found: Conversations = defaultdict(list)
    if not wanted:
        return found
    for batch in RecordBatches(output, CONVERSATION_COLUMNS):
        ids, samples = batch.column("id").to_pylist(), batch.column("sample").to_pylist()
        rows = [at for at, key in enumerate(zip(ids, samples, strict=True)) if key in wanted]
        if not rows:
            continue
        for record in batch.take(rows).to_pylist():
            if isinstance(record["finish_reason"], str):
                record["finish_reason"] = orjson.loads(record["finish_reason"])
            found[(record["id"], record["sample"])].append(record)
    for records in found.values():
        records.sort(key=lambda record: record.get("turn") or 0)
    return found
