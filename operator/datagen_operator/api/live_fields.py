"""Which spec fields may change once bulk records exist (spec policy: the operator and the docs follow it).

A live field changes how the run is carried out, never what a record contains; every other field is frozen once
the workers have started, so an output never mixes two configurations.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

LIVE_FIELDS: tuple[tuple[str, ...], ...] = (
    ("suspend",),
    ("checks",),
    ("server", "replicas"),
    ("server", "startupTimeout"),
    ("server", "nodeSelector"),
    ("server", "tolerations"),
    ("server", "affinity"),
    ("server", "priorityClassName"),
    ("clients", "concurrency"),
    ("clients", "requestTimeout"),
    ("clients", "maxAttempts"),
    ("clients", "cpu"),
    ("clients", "memory"),
    ("clients", "nodeSelector"),
    ("clients", "tolerations"),
)
"""Fields that do not change what a record contains; every other field does (model, server args, dataset,
generation, output, shards) and is frozen once the workers have started."""


def without_fields(document: dict[str, Any], paths: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    """A copy of a spec document without the fields at `paths`."""
    out = copy.deepcopy(document)
    for path in paths:
        node = out
        for key in path[:-1]:
            node = node.get(key, {})
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def changed_data_fields(new: dict[str, Any], applied: dict[str, Any]) -> list[str]:
    """Dotted paths of data-affecting fields that differ between two spec documents."""
    changed: list[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        elif a != b:
            changed.append(f"spec.{path}")

    walk(without_fields(new, LIVE_FIELDS), without_fields(applied, LIVE_FIELDS), "")
    return changed


def merge_live_fields(new: dict[str, Any], applied: dict[str, Any]) -> dict[str, Any]:
    """The applied spec with the new spec's live fields: what runs when data-affecting changes are refused."""
    out = copy.deepcopy(applied)
    for path in LIVE_FIELDS:
        source: Any = new
        for key in path:
            source = source.get(key) if isinstance(source, dict) else None
        target = out
        for key in path[:-1]:
            target = target.setdefault(key, {})
        if source is None:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = copy.deepcopy(source)
    return out
