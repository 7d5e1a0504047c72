"""The run's status writer: conditions applied in one place (control/conditions.py `apply_updates`), written
when something urgent changed or the progress spacing allows (control/throttle.py), the metrics that follow
the status, and an event for each transition."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api.spec import API_GROUP_VERSION, KIND
from datagen_operator.api.status import DataGenRunStatus, ServerStatus
from datagen_operator.control.conditions import ConditionUpdate, Event, apply_updates, rfc3339, transition_events
from datagen_operator.control.decision import Decision
from datagen_operator.control.observed import Observed
from datagen_operator.control.throttle import progress_spacing, progress_write_due
from datagen_operator.k8s import metrics
from datagen_operator.k8s.context import OperatorContext
from datagen_operator.k8s.kube import namespace_terminating

log = logging.getLogger("datagen.operator")


@dataclass(frozen=True)
class Facts:
    """What the status carries besides the decision, as this pass observed it."""

    server_info: Mapping[str, Any] | None
    """The server's /server_info, once read (its version and parsers)."""
    fingerprint: str | None
    """The workers' fingerprint of the data, from their progress ConfigMaps."""
    worker_image: str | None


class StatusWriter:
    def __init__(self, ctx: OperatorContext, namespace: str, name: str) -> None:
        self.ctx, self.namespace, self.name = ctx, namespace, name
        self.status: dict[str, Any] | None = None
        """The status this operator last wrote; the watch may lag behind it."""
        self.last_write = 0.0
        self.queued_since: float | None = None
        """Since when the run's server has waited for a place (metrics.queued_since); this process's clock."""

    def last(self, body: Mapping[str, Any]) -> DataGenRunStatus:
        """The run's status as this operator last wrote it (the run's own until the first write)."""
        return DataGenRunStatus.model_validate(self.status if self.status is not None else body.get("status") or {})

    async def report(
        self,
        body: Mapping[str, Any],
        old: DataGenRunStatus,
        decision: Decision,
        generation: int,
        now: datetime,
        extra: Iterable[ConditionUpdate],
        observed: Observed | None,
        facts: Facts,
    ) -> bool:
        """Writes the status when due and posts its transitions' events. False: an event was refused because the
        run's namespace is being deleted (the caller lets the run go)."""
        status = self._status(old, decision, generation, now, extra, observed, facts)
        new = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        before = old.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.queued_since = metrics.queued_since(new, self.queued_since, now.timestamp())
        queued = 0.0 if self.queued_since is None else max(0.0, now.timestamp() - self.queued_since)
        metrics.observe_status(self.namespace, self.name, new, observed.server if observed else None, queued)
        if not self._due(new, before):
            return True
        patch = merge_patch(before, new)
        await self.ctx.kube.patch_status(self.namespace, self.name, patch)
        self.status, self.last_write = new, asyncio.get_running_loop().time()
        for condition in status.conditions:
            previous = next((c for c in old.conditions if c.type == condition.type), None)
            if previous is None or (previous.status, previous.reason) != (condition.status, condition.reason):
                metrics.count_transition(condition.type, condition.status, condition.reason)
        taken = True
        for event in transition_events(old.conditions, status.conditions):
            taken = await post_run_event(self.ctx, body, event) and taken
        return taken

    def _status(
        self,
        old: DataGenRunStatus,
        decision: Decision,
        generation: int,
        now: datetime,
        extra: Iterable[ConditionUpdate],
        observed: Observed | None,
        facts: Facts,
    ) -> DataGenRunStatus:
        # A pass that observed nothing (a halt that stands, a spec that does not parse) keeps what was said.
        server = old.server if observed is None else None
        if observed is not None and observed.server is not None:
            info = facts.server_info or {}
            was = old.server
            server = ServerStatus(
                endpoints=list(observed.server.ready_endpoints),
                ready_replicas=len(observed.server.ready_endpoints),
                replicas=observed.server.replicas_wanted if decision.server_wanted else 0,
                version=info.get("version") or (was.version if was else None),
                reasoning_parser=info.get("reasoning_parser") or (was.reasoning_parser if was else None),
                tool_call_parser=info.get("tool_call_parser") or (was.tool_call_parser if was else None),
                external=True if observed.server.external else None,
            )
        return DataGenRunStatus(
            observed_generation=generation,
            phase=decision.phase,
            halted=decision.halted,
            conditions=apply_updates(old.conditions, [*decision.updates, *extra], now, generation),
            progress=decision.progress,
            checks=list(decision.checks),
            fingerprint=facts.fingerprint or old.fingerprint,
            server=server,
            started_at=old.started_at or rfc3339(now),
            completed_at=(old.completed_at or rfc3339(now)) if decision.finished else None,
            worker_image=facts.worker_image or old.worker_image,
            # The canary's verdict of this data generation (remembered from here once its pod is gone).
            concurrency=old.concurrency if observed is None else _resolved_concurrency(observed),
        )

    def _due(self, new: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
        """An urgent change goes out at once; counts that moved every progress_write_s, words alone (a loading
        timer) every message_write_s, all runs together within progress_writes_per_s."""
        if signature(new) != signature(before):
            return True
        if new == before:
            return False
        settings = self.ctx.settings
        moved = new.get("progress") != before.get("progress")
        every = settings.progress_write_s if moved else max(settings.progress_write_s, settings.message_write_s)
        spacing = progress_spacing(every, len(self.ctx.wakers), settings.progress_writes_per_s)
        return progress_write_due(self.last_write, asyncio.get_running_loop().time(), spacing)


def _resolved_concurrency(observed: Observed) -> int | None:
    return observed.canary.concurrency if observed.canary is not None else None


def merge_patch(before: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch from `before` to `new`: keys set to None clear what this pass no longer reports, in
    nested objects too (status.progress.eta once the workers stop)."""
    patch: dict[str, Any] = {key: None for key in before if key not in new}
    for key, value in new.items():
        was = before.get(key)
        patch[key] = merge_patch(was, value) if isinstance(value, dict) and isinstance(was, dict) else value
    return patch


def signature(status: Mapping[str, Any]) -> dict[str, Any]:
    """What makes a status write urgent: everything but numbers and messages (a loading timer, a token rate,
    a check's rate over more records). Those ride along with the next write, or go out every progress_write_s;
    a check that flips (passed) or a condition that changes (status, reason) goes out at once."""
    out = {k: v for k, v in status.items() if k not in ("progress", "conditions", "checks")}
    out["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in status.get("conditions") or []]
    out["checks"] = [(c.get("name"), c.get("passed")) for c in status.get("checks") or []]
    return out


async def post_run_event(ctx: OperatorContext, body: Mapping[str, Any], event: Event) -> bool:
    """One event on the run (a transition, a storage warning), logged as well: what a person reading the log
    needs. An event is auxiliary: refused or failed, it is not retried. False when the run's namespace is being
    deleted (it takes no new content), for the caller to stop the run."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    level = logging.WARNING if event.type == "Warning" else logging.INFO
    log.log(level, "%s/%s: %s", namespace, name, event.message)
    involved = {
        "apiVersion": body.get("apiVersion") or API_GROUP_VERSION,
        "kind": body.get("kind") or KIND,
        "name": name,
        "namespace": namespace,
        "uid": meta["uid"],
    }
    component, instance = ctx.reporter
    try:
        await ctx.kube.post_event(
            involved, event.type, event.reason, event.message, component=component, instance=instance
        )
    except ApiException as error:
        if namespace_terminating(error):
            return False
        if error.status not in (404, 409):  # 404: the run or its namespace is gone; 409: a name clash
            log.warning("%s/%s: event %s not posted: %s", namespace, name, event.reason, error.reason)
    except (aiohttp.ClientError, TimeoutError) as error:
        log.warning("%s/%s: event %s not posted: %r", namespace, name, event.reason, error)
    return True
