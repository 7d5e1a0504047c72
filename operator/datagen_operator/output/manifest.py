"""manifest.json: the output's fingerprint, shard count and per-shard counts, updated under a lock."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.output.layout import OutputLayout, write_atomic

MANIFEST_FORMAT = "datagen-output/v1"

ManifestChange = Callable[[dict[str, Any] | None], dict[str, Any]]
"""What a writer does to the manifest under the lock: the current one (None before the first) in, the new one out."""


@contextlib.contextmanager
def manifest_lock(layout: OutputLayout) -> Iterator[None]:
    """Serialises manifest read-modify-write between shard processes (flock; works on local and NFSv4)."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with layout.manifest_lock.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def read_manifest(output_dir: str | Path) -> dict[str, Any] | None:
    """The run's manifest.json, or None before any worker has started."""
    path = OutputLayout(Path(output_dir)).manifest
    try:
        manifest: dict[str, Any] = orjson.loads(path.read_bytes())
        return manifest
    except FileNotFoundError:
        return None


def update_manifest(layout: OutputLayout, change: ManifestChange) -> dict[str, Any]:
    """Apply `change(manifest_or_None) -> manifest` under the lock and write it atomically."""
    with manifest_lock(layout):
        current = read_manifest(layout.root)
        updated = change(current)
        updated["updated_at"] = time.time()
        updated["counts"] = _total_counts(updated.get("shards", {}))
        write_atomic(layout.manifest, orjson.dumps(updated, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        return updated


def _total_counts(shards: dict[str, dict[str, Any]]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for entry in shards.values():
        for name, value in entry.get("counts", {}).items():
            if isinstance(value, int):
                totals[name] += value
    totals["shards_complete"] = sum(1 for entry in shards.values() if entry.get("state") == "complete")
    return dict(totals)
