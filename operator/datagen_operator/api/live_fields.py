"""Which spec fields may change once bulk records exist (spec policy: the operator and the docs follow it).

A live field changes how the run is carried out, never what a record contains; every other field is frozen once
the workers have started, so an output never mixes two configurations.
"""

from __future__ import annotations

import copy
import json
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
    ("queue",),
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


_AT_ONCE = "takes effect at once"
_NEXT_SERVER_POD = (
    "takes effect at once while no server pod is bound to a node, else at the next server start (a bound pod "
    "keeps its GPUs and its loaded model)"
)
_NEXT_WORKER_PODS = "takes effect when new worker pods start (a resume or a retry); the running workers keep {old}"
WHEN_EFFECTIVE: dict[tuple[str, ...], str] = {
    ("checks",): "takes effect at once: the next pass judges the records by it",
    ("server", "replicas"): "takes effect at once: the server scales",
    ("server", "startupTimeout"): _AT_ONCE,
    ("server", "nodeSelector"): _NEXT_SERVER_POD,
    ("server", "tolerations"): _NEXT_SERVER_POD,
    ("server", "affinity"): _NEXT_SERVER_POD,
    ("server", "priorityClassName"): _NEXT_SERVER_POD,
    ("queue",): _NEXT_SERVER_POD,
    **{("clients", name): _NEXT_WORKER_PODS for name in ("concurrency", "requestTimeout", "maxAttempts", "cpu",
                                                         "memory", "nodeSelector", "tolerations")},
}  # fmt: skip
"""When a change of each live field (but `suspend`, which has its own conditions) reaches the run."""


def _at(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _shown(value: Any) -> str:
    return "unset" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def live_changes(new: dict[str, Any], applied: dict[str, Any]) -> list[str]:
    """Each live field that differs between two spec documents, old -> new, and when it takes effect."""
    out = []
    for path, when in WHEN_EFFECTIVE.items():
        before, after = _at(applied, path), _at(new, path)
        if before != after:
            out.append(f"spec.{'.'.join(path)} {_shown(before)} -> {_shown(after)}: {when.format(old=_shown(before))}")
    return out


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
