"""The shard's entries in the output's manifest: claiming the output for this run's fingerprint, the run
file kept beside it, and each shard's counts and Parquet once it ends."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import Reason
from datagen_operator.output.fingerprint import diff_fingerprints, fingerprint_sha256
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import MANIFEST_FORMAT, update_manifest
from datagen_operator.output.parquet import CompactionResult
from datagen_operator.worker.config import BadInput, FingerprintMismatch, WorkerConfig

if TYPE_CHECKING:
    from datagen_operator.prompts.pin import DatasetPin
    from datagen_operator.prompts.scan import ShardScan


def claim_output(layout: OutputLayout, c: WorkerConfig, fingerprint: dict[str, Any]) -> None:
    """Write the fingerprint to a new output, or refuse an output made with a different one."""
    digest = fingerprint_sha256(fingerprint)

    def change(manifest: dict[str, Any] | None) -> dict[str, Any]:
        if manifest is None:
            return {
                "format": MANIFEST_FORMAT,
                "created_at": time.time(),
                "fingerprint": fingerprint,
                "fingerprint_sha256": digest,
                "shard_count": c.shard_count,
                "shards": {},
            }
        if manifest.get("fingerprint_sha256") != digest:
            changes = diff_fingerprints(manifest.get("fingerprint", {}), fingerprint)
            raise FingerprintMismatch(
                f"refusing to write into {c.output}: it was generated with a different fingerprint; changed: "
                + ("; ".join(changes) or "(fingerprint format)")
                + ". Use a new output path, or restore the original tokenizer, server and sampling."
            )
        if manifest.get("shard_count") != c.shard_count:
            raise FingerprintMismatch(
                f"refusing to write into {c.output}: it was sharded {manifest.get('shard_count')} ways, "
                f"this worker uses {c.shard_count} (the shard assignment would change)"
            )
        return manifest

    update_manifest(layout, change)


def keep_run_file(c: WorkerConfig) -> None:
    """OUTPUT/run.yaml, as `datagen run` writes it, once the output is ours (fingerprint claimed). Every
    shard writes the same applied manifest; the rename makes each write whole."""
    source, target = c.run_file, OutputLayout(c.output).run_file
    if source is None or (target.exists() and target.samefile(source)):
        return
    staging = target.with_name(f".run.yaml.{c.shard_index}.tmp")
    staging.write_bytes(source.read_bytes())
    os.replace(staging, target)


def record_shard(
    layout: OutputLayout, shard_index: int, p: ShardProgress, compaction: CompactionResult | None
) -> dict[str, Any]:
    """The shard's state and counts (and its Parquet, once compacted) in manifest.json; the manifest now."""
    c = p.counts
    entry: dict[str, Any] = {
        "state": p.state,
        "counts": {
            "prompts": p.prompts_total,
            "malformed_lines": p.malformed_lines,
            "unrenderable_prompts": c.unusable - p.malformed_lines,
            "too_long_prompts": c.too_long,
            "records": c.records,
            "records_total": p.records_total,
            "rejected": c.refused,
            "set_aside_records": c.records_set_aside,
            "failed": c.failed,
            "prompt_tokens": c.prompt_tokens,
            "output_tokens": c.output_tokens,
        },
        "flags": dict(c.flags),
        "set_aside": dict(c.set_aside),
        "updated_at": time.time(),
    }
    if compaction is not None:
        entry.update(
            parquet=str(compaction.path.relative_to(layout.root)),
            parquet_sha256=compaction.sha256,
            parquet_bytes=compaction.bytes,
            parquet_rows=compaction.rows,
        )

    def change(manifest: dict[str, Any] | None) -> dict[str, Any]:
        assert manifest is not None
        manifest.setdefault("shards", {})[f"{shard_index:05d}"] = entry
        return manifest

    return update_manifest(layout, change)


def every_shard_complete(manifest: dict[str, Any], shard_count: int) -> bool:
    shards = manifest.get("shards") or {}
    return all((shards.get(f"{index:05d}") or {}).get("state") == "complete" for index in range(shard_count))


def dataset_change(config: WorkerConfig) -> str | None:
    """The dataset against the pin in the output (prompts/pin.py), or the pin written when there is none yet
    (a worker run without the preflight): every shard computes the same one."""
    from datagen_operator.prompts.pin import pin_dataset, read_pin, write_pin

    pinned = read_pin(config.output)
    if pinned is None:
        write_pin(config.output, pin_dataset(config.dataset_ref))
        return None
    return pinned_change(config, pinned)


def pinned_change(config: WorkerConfig, pinned: DatasetPin) -> str | None:
    """What changed in the dataset since `pinned`, as the message that refuses it, or None (one sha256 of the file
    while nothing did)."""
    from datagen_operator.prompts.pin import changed_message, dataset_changes

    changes = dataset_changes(config.dataset_ref, pinned)
    return changed_message(config.dataset, changes) if changes else None


def start_pin(config: WorkerConfig) -> DatasetPin | None:
    """At start: the output's pin, the dataset held to it (BadInput naming what changed). Without a pin (a worker
    run without the preflight) a JSONL dataset is pinned by the plan's read (`pin_while_read`): None; any other
    format is pinned here, before the first request."""
    from datagen_operator.prompts.pin import pin_dataset, read_pin, write_pin

    pinned = read_pin(config.output)
    if pinned is not None:
        changed = pinned_change(config, pinned)
        if changed is not None:
            raise BadInput(changed, Reason.DATASET_CHANGED)
        return pinned
    dataset = config.dataset_ref
    if dataset.read_format() == "jsonl":
        return None
    pin = pin_dataset(dataset)
    write_pin(config.output, pin)
    return pin


def pin_while_read(config: WorkerConfig, plan: ShardScan, rendered_on: str) -> None:
    """The dataset pinned by the plan's read (every line, every shard's), written once the read ends: a dataset
    of a million lines is not read twice before the first request. A pin another shard wrote meanwhile is kept,
    and this read held to it (BadInput naming what changed)."""
    from datagen_operator.prompts.pin import LinePins, changed_message, pin_changes, read_pin, write_pin

    def pinned(pin: DatasetPin) -> None:
        other = read_pin(config.output)
        if other is None:
            write_pin(config.output, pin)
            return
        changes = pin_changes(other, pin)
        if changes is not None:
            raise BadInput(changed_message(config.dataset, changes), Reason.DATASET_CHANGED)

    plan.lines = LinePins(plan.dataset, rendered_on, pinned)
