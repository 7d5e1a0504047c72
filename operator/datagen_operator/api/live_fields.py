"""Which spec fields may change once bulk records exist (spec policy: the operator and the docs follow it).

A live field changes how the run is carried out, never what a record contains; every other field is frozen once
the workers have started, so an output never mixes two configurations.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
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


def words(value: Any) -> str:
    """A spec value as a person reads it in a condition (never raw JSON): `0.9`, `10m`, `unset`,
    `(gpu=a100)`, `key=nvidia.com/gpu operator=Exists`."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return " ".join(f"{key}={words(value[key])}" for key in sorted(value)) or "none"
    if isinstance(value, list):
        return "; ".join(words(item) for item in value) or "none"
    return str(value)


@dataclass(frozen=True)
class LiveChange:
    """One live field that changed, at its leaf: `spec.checks.minReasoningRate 0.98 → 0.9`."""

    field: str
    before: str
    after: str
    when: str
    """When it reaches a running run (WHEN_EFFECTIVE)."""

    def said(self, finished: bool = False) -> str:
        """The change and what it does: for a finished run, nothing (its final verdict stands)."""
        when = FINISHED if finished else self.when
        return f"{self.field} {self.before} → {self.after}: {when}"

    def __str__(self) -> str:
        return self.said()


FINISHED = "recorded; the run has finished, so it changes nothing now (its final verdict stands)"


def _leaves(before: Any, after: Any, path: str) -> list[tuple[str, Any, Any]]:
    """The differing leaves of two values under `path`: dicts are walked key by key, anything else is a leaf."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[tuple[str, Any, Any]] = []
        for key in sorted(set(before) | set(after)):
            out += _leaves(before.get(key), after.get(key), f"{path}.{key}")
        return out
    return [] if before == after else [(path, before, after)]


def live_changes(new: dict[str, Any], applied: dict[str, Any]) -> list[LiveChange]:
    """Each live field that differs between two spec documents, leaf by leaf, old → new, and when it takes
    effect."""
    out = []
    for path, when in WHEN_EFFECTIVE.items():
        before, after = _at(applied, path), _at(new, path)
        for name, old, now in _leaves(before, after, "spec." + ".".join(path)):
            out.append(LiveChange(name, words(old), words(now), when.format(old=words(before))))
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
