"""What every run's daemon shares: the operator's settings, its API and HTTP clients, the watch caches and the
wakers that end a daemon's wait early."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from datagen_operator.k8s.kube import Kube
from datagen_operator.k8s.object_meta import COMPONENT_LABEL
from datagen_operator.k8s.settings import Settings

Lookup = Callable[[str, str, str], list[Mapping[str, Any]]]
"""(kind, namespace, run) -> the run's children of that kind from the watch cache."""


@dataclass
class OperatorContext:
    settings: Settings
    kube: Kube
    http: aiohttp.ClientSession
    children: Lookup
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    reporter: tuple[str, str] = ("datagen-operator", "datagen-operator")
    """(component, instance) the operator's events come from: kubectl describe's "From"."""

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        event = self.wakers.get((namespace, name))
        if event is not None:
            event.set()


@dataclass(frozen=True)
class RunCache:
    """One run's children as the watch cache holds them."""

    ctx: OperatorContext
    namespace: str
    name: str

    def children(self, kind: str) -> list[Mapping[str, Any]]:
        return self.ctx.children(kind, self.namespace, self.name)

    def named(self, kind: str, name: str) -> Mapping[str, Any] | None:
        return next((c for c in self.children(kind) if c["metadata"]["name"] == name), None)

    def pods(self, component: str) -> list[Mapping[str, Any]]:
        return [p for p in self.children("Pod") if p["metadata"].get("labels", {}).get(COMPONENT_LABEL) == component]
