"""One pass over one run: observe (k8s/observer.py), decide once (control/decide.py), plan
(k8s/children.py), carry the plan out (k8s/executor.py), report (k8s/status_writer.py). The kopf daemon of
each run calls `Reconciler.run_pass` in a loop."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api import SpecError, parse_spec_resolved
from datagen_operator.api.names import server_name
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import DataGenRunStatus
from datagen_operator.checks.evaluate import check_context
from datagen_operator.control.conditions import ConditionUpdate
from datagen_operator.control.decide import decide
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import Observed, ProbeFailures
from datagen_operator.control.progress import eta_seconds, with_eta
from datagen_operator.control.remembered import remembered_halt
from datagen_operator.k8s import object_meta, run_manifests, server_hashes, server_manifests
from datagen_operator.k8s.children import (
    SpecInForce,
    WantedServer,
    children_accepted,
    plan,
    spec_applied,
    spec_in_force,
    suspend_on_halt,
)
from datagen_operator.k8s.context import OperatorContext, RunCache
from datagen_operator.k8s.executor import Executor, stop_children
from datagen_operator.k8s.inventory import inventory
from datagen_operator.k8s.kube import namespace_terminating
from datagen_operator.k8s.kueue_jobs import with_jobs_queued
from datagen_operator.k8s.object_facts import annotation
from datagen_operator.k8s.observer import Observer
from datagen_operator.k8s.registry import BuildInputs
from datagen_operator.k8s.status_writer import Facts, StatusWriter

log = logging.getLogger("datagen.operator")


@dataclass
class Reconciler:
    """The per-run shell state that survives between passes (not across operator restarts: none is needed)."""

    ctx: OperatorContext
    namespace: str
    name: str
    cache: RunCache = field(init=False)
    observer: Observer = field(init=False)
    executor: Executor = field(init=False)
    writer: StatusWriter = field(init=False)
    worker_image: str | None = None
    """The operator's worker image the run started with (status.workerImage), found once per pass."""
    namespace_going: bool = False
    """The run's namespace is being deleted (the API server refuses new content there): the run is only let go."""
    paced_from: tuple[float, int] | None = None
    """When this operator first saw the workers generate since they last stopped, and the records done then: the
    rate the ETA is read from (lost with an operator restart: the next one counts from its own first look)."""

    def __post_init__(self) -> None:
        self.cache = RunCache(self.ctx, self.namespace, self.name)
        self.observer = Observer(self.ctx, self.cache)
        self.executor = Executor(self.ctx.kube, self.cache)
        self.writer = StatusWriter(self.ctx, self.namespace, self.name)

    async def run_pass(self, body: Mapping[str, Any]) -> Decision | None:
        if body["metadata"].get("deletionTimestamp"):
            return None  # the finalizer's turn: nothing may be (re)created now
        try:
            if not self.namespace_going and await self.observer.namespace_deleted():
                self._let_go("a pod of the run terminates and the namespace takes no new objects")
            if not self.namespace_going:
                return await self._pass(body)
        except ApiException as error:
            if not namespace_terminating(error):
                raise
            self._let_go(f"the API server refused a write: {error.reason}")
        # The namespace goes: its pods were deleted first, and the run's DataGenRun only follows once they are
        # gone. The workers' Job holds a failed pod of each unfinished shard for a replacement that the namespace
        # will never accept (its tracking finalizer), so the children are stopped as a deletion stops them;
        # nothing is judged, reported or created any more.
        await stop_children(self.ctx.kube, self.namespace, self.name)
        return None

    def _let_go(self, why: str) -> None:
        if not self.namespace_going:
            said = "%s/%s: the namespace is being deleted (%s): stopping the run's children, reporting nothing more"
            log.info(said, self.namespace, self.name, why)
        self.namespace_going = True

    async def _pass(self, body: Mapping[str, Any]) -> Decision | None:
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        run = object_meta.RunRef(self.name, self.namespace, meta["uid"])
        old = self.writer.last(body)
        now = datetime.now(UTC)
        try:
            # The model is resolved once per pass (while the spec is validated) and handed down.
            spec, resolved = parse_spec_resolved(dict(body.get("spec") or {}))
        except SpecError as error:
            decision = decide(None, Observed(generation=generation, spec_error=str(error)), None)
            await self._report(body, old, decision, generation, now, None)
            return decision

        spec, resolved, in_force = await self._spec_in_force(run, spec, resolved, generation)
        self.worker_image = self.observer.worker_image(old.worker_image, spec)
        urls = server_manifests.server_urls(self.name, self.namespace, spec, self.ctx.settings.test_server_urls)
        context = check_context(resolved, spec.checks)  # no tokenizer here: the preset's think-end id
        halted = remembered_halt(old, in_force.changed_generation)
        if halted is not None:
            # The halt stands (decide says so without looking further): nothing to observe, nothing to report.
            self.observer.parser_probes = ProbeFailures()  # a later spec counts its own probes
            observed = Observed(generation=generation, halted=halted)
            decision = decide(spec, observed, context)
            await self._act(run, spec, resolved, decision, observed, urls, in_force.data_generation)
            # Only spec.suspend moved (any other change lifts the halt): the generation is acknowledged, and the
            # suspend answered in words, not left unanswered behind observedGeneration.
            said = [suspend_on_halt(spec.suspend, halted.reason)] if in_force.suspend_changed else []
            await self._report(body, old, decision, generation, now, None, said)
            return decision
        refused_writes = self.executor.refused_writes
        observed = await self.observer.observe(
            spec, resolved, generation, in_force.data_generation, old, urls, now, refused_writes
        )
        decision = self._with_eta(with_jobs_queued(decide(spec, observed, context), observed), now)
        if not old.conditions:
            # A new run: `kubectl get dgr` shows what it is about to do before its children are written (with
            # many runs applied at once, those writes queue behind each other's).
            await self._report(body, old, decision, generation, now, observed)
            old = self.writer.last(body)
        await self._act(run, spec, resolved, decision, observed, urls, in_force.data_generation)
        extra = [
            *spec_applied(in_force.refused, old.conditions, in_force.live_changed, finished=decision.step is Step.DONE),
            *children_accepted({**self.executor.refused_writes, **self.observer.refused_pods}, old.conditions),
        ]
        await self._report(body, old, decision, generation, now, observed, extra)
        return decision

    def _with_eta(self, decision: Decision, now: datetime) -> Decision:
        """The decision with the ETA in its progress while the workers generate; a run that stops (suspended,
        halted, waiting for its server) starts its rate over when it goes on."""
        progress = decision.progress
        if decision.step is not Step.RUN_WORKERS or progress is None or not progress.records_total:
            self.paced_from = None
            return decision
        here = (now.timestamp(), progress.records_done)
        if self.paced_from is None:
            self.paced_from = here
        return replace(
            decision, progress=with_eta(progress, eta_seconds(self.paced_from, here, progress.records_total), now)
        )

    async def _spec_in_force(
        self, run: object_meta.RunRef, spec: DataGenRunSpec, resolved: ResolvedModel, generation: int
    ) -> tuple[DataGenRunSpec, ResolvedModel, SpecInForce]:
        """The spec in force (and its model), the generation of its data-affecting part, refused data changes
        (k8s/children.py `spec_in_force`), written to the run's spec ConfigMap."""
        applied = await self.observer.applied_spec()
        in_force = spec_in_force(
            run_manifests.spec_document(spec),
            applied.document,
            applied.data_generation,
            generation,
            bulk_started=self.observer.bulk_started,
            applied_changed_generation=applied.changed_generation,
        )
        if in_force.refused:
            spec, resolved = parse_spec_resolved(in_force.document)
        manifest = run_manifests.spec_configmap(run, spec, in_force.data_generation, in_force.changed_generation)
        await self.executor.record_spec(
            manifest, applied.configmap, run_manifests.spec_document(spec) != applied.document
        )
        return spec, resolved, in_force

    async def _act(
        self,
        run: object_meta.RunRef,
        spec: DataGenRunSpec,
        resolved: ResolvedModel,
        decision: Decision,
        observed: Observed,
        urls: list[str],
        data_generation: int,
    ) -> None:
        """The plan for this decision over the children that exist, carried out."""
        grouped = spec.server.nodes > 1
        statefulset = self.cache.named("StatefulSet", server_name(self.name))
        group = self.observer.group_set
        server = server_hashes.with_hashes(server_manifests.server_workload(run, spec, spec.server.replicas, resolved))
        jobs, pods = self.cache.children("Job"), self.cache.children("Pod")
        children = inventory(self.name, jobs, pods, statefulset, group, grouped=grouped)
        actions = plan(
            spec,
            decision,
            observed,
            children,
            data_generation,
            urls=urls,
            server=WantedServer(
                restart_hash=annotation(server, object_meta.RESTART_HASH) or "",
                admission_hash=annotation(server, object_meta.ADMISSION_HASH) or "",
            ),
        )
        image = spec.clients.image or self.worker_image or self.ctx.settings.worker_image
        inputs = BuildInputs(run, spec, image, data_generation, tuple(urls))
        await self.executor.carry_out(actions, inputs, server, group if grouped else statefulset)

    async def _report(
        self,
        body: Mapping[str, Any],
        old: DataGenRunStatus,
        decision: Decision,
        generation: int,
        now: datetime,
        observed: Observed | None,
        extra: list[ConditionUpdate] | None = None,
    ) -> None:
        facts = Facts(self.observer.server_info, self.observer.fingerprint(), self.worker_image)
        if not await self.writer.report(body, old, decision, generation, now, extra or [], observed, facts):
            self._let_go("the API server refused an event")
