"""One pass over one run: observe (watch cache + the server's own answers), decide (control/), act
(children), report (status, events). The kopf daemon of each run calls `Reconciler.run_pass` in a loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api import SpecError, parse_spec_resolved
from datagen_operator.api.names import (
    canary_job_name,
    export_job_name,
    preflight_job_name,
    server_name,
    server_pod_name,
    spec_configmap_name,
    verify_job_name,
    workers_job_name,
)
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import API_GROUP, API_VERSION, DataGenRunSpec
from datagen_operator.api.status import (
    CANARY_PASSED,
    EXPORTED,
    PARSERS_VERIFIED,
    DataGenRunStatus,
    ServerStatus,
)
from datagen_operator.checks.evaluate import check_context
from datagen_operator.control.children import (
    Apply,
    Child,
    Create,
    Delete,
    Serve,
    SpecInForce,
    SuspendWorkers,
    children_accepted,
    made_for,
    plan,
    spec_applied,
    spec_in_force,
)
from datagen_operator.control.conditions import ConditionUpdate, Event, apply_updates, rfc3339, transition_events
from datagen_operator.control.decide import Decision, Step, decide
from datagen_operator.control.observed import Observed, ProbeFailures
from datagen_operator.control.remembered import (
    remembered_final,
    remembered_halt,
    remembered_outcome,
    remembered_preflight,
    remembered_workers,
)
from datagen_operator.control.throttle import progress_spacing, progress_write_due
from datagen_operator.k8s import groups, metrics
from datagen_operator.k8s import manifests as m
from datagen_operator.k8s import observe as o
from datagen_operator.k8s.inventory import JOBS, inventory
from datagen_operator.k8s.kube import Kube, drifted, namespace_terminating, refusal
from datagen_operator.k8s.observe import annotation
from datagen_operator.k8s.settings import Settings

log = logging.getLogger("datagen.operator")

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


@dataclass
class Reconciler:
    """The per-run shell state that survives between passes (not across operator restarts: none is needed)."""

    ctx: OperatorContext
    namespace: str
    name: str
    status: dict[str, Any] | None = None
    """The status this operator last wrote; the watch may lag behind it."""
    last_write: float = 0.0
    server_info: dict[str, Any] | None = None
    refused_writes: dict[str, str] = field(default_factory=dict)
    """'Kind/name' -> the API server's words, for writes it refused; cleared when the same write succeeds."""
    refused_pods: dict[str, str] = field(default_factory=dict)
    """'Job/name' -> why its controller could not create a pod (FailedCreate), as of this pass."""
    parser_probes: ProbeFailures = field(default_factory=ProbeFailures)
    """Failed reads of the server's parsers (control.policy bounds them; decide() turns too many into a halt)."""
    group_set: Mapping[str, Any] | None = None
    """The run's LeaderWorkerSet (server.nodes > 1), read once per pass: the operator does not watch them, so it
    runs where LWS is not installed."""
    worker_image: str | None = None
    """The operator's worker image the run started with (status.workerImage), found once per pass."""
    namespace_going: bool = False
    """The run's namespace is being deleted (the API server refuses new content there): the run is only let go."""
    probed: tuple[frozenset[tuple[str, bool]], float] | None = None
    """The run's pods (uid, terminating) when the namespace was last asked whether it is being deleted, and when."""

    # --- cache reads ---------------------------------------------------------------------------

    def _children(self, kind: str) -> list[Mapping[str, Any]]:
        return self.ctx.children(kind, self.namespace, self.name)

    def _named(self, kind: str, name: str) -> Mapping[str, Any] | None:
        return next((c for c in self._children(kind) if c["metadata"]["name"] == name), None)

    def _pods(self, component: str) -> list[Mapping[str, Any]]:
        return [p for p in self._children("Pod") if p["metadata"].get("labels", {}).get(m.COMPONENT_LABEL) == component]

    # --- the pass ------------------------------------------------------------------------------

    async def run_pass(self, body: Mapping[str, Any]) -> Decision | None:
        if body["metadata"].get("deletionTimestamp"):
            return None  # the finalizer's turn: nothing may be (re)created now
        try:
            if not self.namespace_going and await self._namespace_deleted():
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

    async def _namespace_deleted(self) -> bool:
        """Whether the namespace is being deleted, asked only while some pod of the run is terminating (a
        namespace's deletion starts with its pods): again when the run's pods change, else once a minute."""
        pods = frozenset(
            (p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in self._children("Pod")
        )
        if not any(terminating for _, terminating in pods):
            return False
        now = asyncio.get_running_loop().time()
        if self.probed is not None and self.probed[0] == pods and now - self.probed[1] < NAMESPACE_PROBE_S:
            return False
        self.probed = (pods, now)
        return not await self.ctx.kube.takes_new_content(self.namespace)

    async def _pass(self, body: Mapping[str, Any]) -> Decision | None:
        meta = body["metadata"]
        generation = int(meta.get("generation") or 1)
        run = m.RunRef(self.name, self.namespace, meta["uid"])
        old = DataGenRunStatus.model_validate(self.status if self.status is not None else body.get("status") or {})
        now = datetime.now(UTC)
        try:
            # The model is resolved once per pass (while the spec is validated) and handed down.
            spec, resolved = parse_spec_resolved(dict(body.get("spec") or {}))
        except SpecError as error:
            decision = decide(None, Observed(generation=generation, spec_error=str(error)), None)
            await self._report(body, old, decision, generation, now, [], None)
            return decision

        spec, resolved, in_force = await self._apply_spec(run, spec, resolved, generation)
        data_generation, refused = in_force.data_generation, in_force.refused
        self.worker_image = m.started_worker_image(
            old.worker_image, self._children("Job"), spec.clients.image, self.ctx.settings.worker_image
        )
        urls = m.server_urls(self.name, self.namespace, spec, self.ctx.settings.test_server_urls)
        context = check_context(resolved, spec.checks)  # no tokenizer here: the preset's think-end id
        halted = remembered_halt(old, in_force.changed_generation)
        if halted is not None:
            # The halt stands (decide says so without looking further): nothing to observe, nothing to report.
            self.parser_probes = ProbeFailures()  # a later spec counts its own probes
            observed = Observed(generation=generation, halted=halted)
            decision = decide(spec, observed, context)
            await self._act(run, spec, resolved, decision, observed, urls, data_generation)
            return decision
        observed = await self._observe(spec, generation, data_generation, old, urls, now)
        decision = decide(spec, observed, context)
        if decision.step == Step.VERIFY_PARSERS and observed.server and observed.server.ready_endpoints:
            outcome = await self._verify_parsers(spec, resolved, observed.server.ready_endpoints[0])
            observed = replace(observed, parsers=outcome, parser_probes=self.parser_probes)
            decision = decide(spec, observed, context)
        if not old.conditions:
            # A new run: `kubectl get dgr` shows what it is about to do before its children are written (with
            # many runs applied at once, those writes queue behind each other's).
            await self._report(body, old, decision, generation, now, [], observed)
            old = DataGenRunStatus.model_validate(self.status or {})
        await self._act(run, spec, resolved, decision, observed, urls, data_generation)
        extra = [
            *spec_applied(refused, old.conditions, in_force.live_changed),
            *children_accepted({**self.refused_writes, **self.refused_pods}, old.conditions),
        ]
        await self._report(body, old, decision, generation, now, extra, observed)
        return decision

    # --- spec ----------------------------------------------------------------------------------

    async def _apply_spec(
        self, run: m.RunRef, spec: DataGenRunSpec, resolved: ResolvedModel, generation: int
    ) -> tuple[DataGenRunSpec, ResolvedModel, SpecInForce]:
        """The spec in force (and its model), the generation of its data-affecting part, refused data changes
        (control/children.py `spec_in_force`), written to the run's spec ConfigMap."""
        name = spec_configmap_name(self.name)
        cm = self._named("ConfigMap", name) or await self.ctx.kube.read("ConfigMap", self.namespace, name)
        applied = None
        applied_generation = changed_generation = None
        if cm is not None:
            applied = (yaml.safe_load((cm.get("data") or {}).get("run.yaml") or "{}") or {}).get("spec") or {}
            recorded = annotation(cm, m.DATA_GENERATION)
            applied_generation = int(recorded) if recorded is not None else None
            changed = annotation(cm, m.SPEC_CHANGED_GENERATION)
            changed_generation = int(changed) if changed is not None else None
        in_force = spec_in_force(
            m.spec_document(spec),
            applied,
            applied_generation,
            generation,
            bulk_started=self._bulk_started,
            applied_changed_generation=changed_generation,
        )
        if in_force.refused:
            spec, resolved = parse_spec_resolved(in_force.document)
        manifest = m.spec_configmap(run, spec, in_force.data_generation, in_force.changed_generation)
        if cm is None:
            await self.ctx.kube.create(manifest)
        elif m.spec_document(spec) != applied:
            await self.ctx.kube.patch(
                "ConfigMap", self.namespace, name, {"metadata": manifest["metadata"], "data": manifest["data"]}
            )
        return spec, resolved, in_force

    def _bulk_started(self) -> bool:
        """The workers' Job exists, or the workers wrote progress: a finished workers' Job deleted by hand does not
        make the output's records unwritten."""
        if self._named("Job", workers_job_name(self.name)) is not None:
            return True
        return bool(o.shard_snapshots(self._children("ConfigMap")))

    # --- observe -------------------------------------------------------------------------------

    async def _observe(
        self,
        spec: DataGenRunSpec,
        generation: int,
        data_generation: int,
        old: DataGenRunStatus,
        urls: list[str],
        now: datetime,
    ) -> Observed:
        sts_name = server_name(self.name)
        server_pods = self._pods("server")
        statefulset = self._named("StatefulSet", sts_name)
        grouped = spec.server.nodes > 1
        if grouped:
            self.group_set = await self.ctx.kube.read(m.LWS_KIND, self.namespace, sts_name)
        # A group's leader is <run>-server-<i>, as a single-node server pod is: the same probes, the same URLs.
        serving = self.group_set if grouped else statefulset
        probe = o.pods_to_probe(server_pods, sts_name, spec.server.replicas) if serving is not None else []
        answers = await asyncio.gather(*(self._healthy(urls[index]) for _, index in probe))
        health = {pod: ok for (pod, _), ok in zip(probe, answers, strict=True)}
        server_refused = None
        if grouped:
            server_refused = self.refused_writes.get(f"{m.LWS_KIND}/{sts_name}")
            leaders = {"metadata": {"name": sts_name}} if self.group_set is not None else None
            server = groups.group_observation(
                server_pods, leaders, spec.server.replicas, spec.server.nodes, urls, health, now, server_refused
            )
        else:
            if statefulset is not None and o.statefulset_short(statefulset, server_pods):
                server_refused = await self._pod_refusal(statefulset)
            server = o.server_observation(
                server_pods, statefulset, spec.server.replicas, urls, health, now, server_refused
            )
        self.refused_pods = {}
        for job in self._children("Job"):
            if o.job_without_pods(job) and (words := await self._pod_refusal(job)):
                self.refused_pods[f"Job/{job['metadata']['name']}"] = words

        checks = old.checks

        def current(job_name: str) -> Mapping[str, Any] | None:
            job = self._named("Job", job_name)
            return job if job is not None and made_for(annotation(job, m.DATA_GENERATION), data_generation) else None

        # A verdict once recorded stands for this data generation: its pod may be gone (users, pod GC) and a
        # Job without its pod would read as "no verdict".
        preflight = remembered_preflight(old, data_generation) or o.job_outcome(
            current(preflight_job_name(self.name)), self._pods("preflight"), "preflight", "preflight"
        )
        canary = remembered_outcome(old.conditions, CANARY_PASSED, data_generation, checks) or o.job_outcome(
            current(canary_job_name(self.name)), self._pods("canary"), "canary", "canary"
        )
        workers_job = self._named("Job", workers_job_name(self.name))
        final = remembered_final(old.conditions, data_generation, checks) or o.job_outcome(
            self._named("Job", verify_job_name(self.name)), self._pods("verify"), "verify", "verification"
        )
        return Observed(
            generation=generation,
            suspended=spec.suspend,
            preflight=preflight,
            server=server,
            parsers=remembered_outcome(old.conditions, PARSERS_VERIFIED, data_generation, checks),
            parser_probes=self.parser_probes,
            canary=canary,
            # A finished workers' Job deleted before the final verdict: its count stands (the status kept it).
            workers=o.workers_observation(workers_job, self._pods("worker"), spec.clients.shards)
            or remembered_workers(old.progress, spec.clients.shards),
            progress=o.progress_counters(self._children("ConfigMap"), workers_job),
            final=final,
            export=remembered_outcome(old.conditions, EXPORTED, data_generation)
            or o.job_outcome(self._named("Job", export_job_name(self.name)), self._pods("export"), "export", "export"),
        )

    async def _pod_refusal(self, controller: Mapping[str, Any]) -> str | None:
        """Why the StatefulSet or Job controller could not create a pod, from its FailedCreate event."""
        return o.creation_refusal(await self.ctx.kube.events_about(self.namespace, controller["metadata"]["uid"]))

    async def _healthy(self, url: str) -> bool:
        from datagen_operator.engine.client.reads import is_healthy

        return await is_healthy(self.ctx.http, url)

    async def _verify_parsers(self, spec: DataGenRunSpec, resolved: ResolvedModel, url: str) -> StepOutcome | None:
        """The server's own word (/server_info) and a chat probe; a failed read is counted for decide()."""
        from datagen_operator.checks.server_truth import model_label, read_running_server, verify_parsers

        try:
            info, probe = await read_running_server(self.ctx.http, url, spec, resolved)
        except Exception as error:  # the server is ready by its probes: decide() bounds the retries
            log.warning("%s/%s: reading the server's parsers failed: %s", self.namespace, self.name, error)
            self.parser_probes = ProbeFailures(self.parser_probes.count + 1, f"{url}: {error}")
            return None
        self.server_info = info
        self.parser_probes = ProbeFailures()
        return verify_parsers(info, probe, resolved, model_label(spec))

    # --- act -----------------------------------------------------------------------------------

    async def _write(self, kind: str, name: str, write: Callable[[], Awaitable[Any]]) -> bool:
        """One write to the API server. A refusal (invalid, quota, admission, RBAC) is kept in the API server's
        words for ChildrenAccepted and the pass goes on; anything else raises (the next pass retries)."""
        key = f"{kind}/{name}"
        try:
            await write()
        except ApiException as error:
            if namespace_terminating(error):
                raise  # not a refusal of this child: the namespace goes (run_pass lets the run go)
            words = refusal(error)
            if kind == m.LWS_KIND and error.status == 404:
                words = LWS_MISSING
            if words is None:
                raise
            if self.refused_writes.get(key) != words:
                log.warning("%s/%s: the API server refused %s: %s", self.namespace, self.name, key, words)
            self.refused_writes[key] = words
            return False
        self.refused_writes.pop(key, None)
        return True

    async def _create(self, manifest: m.Manifest) -> bool:
        return await self._write(manifest["kind"], manifest["metadata"]["name"], lambda: self.ctx.kube.create(manifest))

    async def _apply(self, manifest: m.Manifest) -> None:
        """A watched child the operator owns whole (Services, the workers' RBAC, shard ConfigMaps): applied
        server-side when it is missing or a field the operator sets was changed by hand; else nothing is sent."""
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if drifted(manifest, self._named(kind, name)):
            await self._write(kind, name, lambda: self.ctx.kube.apply(manifest))

    async def _act(
        self,
        run: m.RunRef,
        spec: DataGenRunSpec,
        resolved: ResolvedModel,
        decision: Decision,
        observed: Observed,
        urls: list[str],
        data_generation: int,
    ) -> None:
        """Sends what control/children.py plans, in its order; a refusal is kept for ChildrenAccepted."""
        grouped = spec.server.nodes > 1
        statefulset = self._named("StatefulSet", server_name(self.name))
        workload = self.group_set if grouped else statefulset
        server = m.with_restart_hash(m.server_workload(run, spec, spec.server.replicas, resolved))
        children = inventory(
            self.name, self._children("Job"), self._children("Pod"), statefulset, self.group_set, grouped=grouped
        )
        actions = plan(
            spec,
            decision,
            observed,
            children,
            data_generation,
            urls=urls,
            server_restart_hash=annotation(server, m.RESTART_HASH) or "",
        )
        image = spec.clients.image or self.worker_image or self.ctx.settings.worker_image
        for action in actions:
            match action:
                case Apply(child, index):
                    await self._apply(self._build(child, index, run, spec, image, data_generation, urls))
                case Create(child, job_urls, taken_before):
                    manifest = self._build(child, 0, run, spec, image, data_generation, list(job_urls), taken_before)
                    await self._create(manifest)
                case Delete(child, index, why):
                    kind, name = self._kind_and_name(child, index)
                    if why:
                        log.info("%s/%s: %s %s %s", self.namespace, self.name, kind, name, why)
                    await self.ctx.kube.delete(kind, self.namespace, name)
                case Serve(replicas, keep_template):
                    await self._serve(replicas, workload if keep_template and workload else server, workload)
                case SuspendWorkers(suspend):
                    body = {"spec": {"suspend": suspend}}
                    await self.ctx.kube.patch("Job", self.namespace, workers_job_name(self.name), body)

    async def _serve(self, replicas: int, template: Mapping[str, Any], existing: Mapping[str, Any] | None) -> None:
        wanted = {**template, "spec": {**template["spec"], "replicas": replicas}}
        scale = {"spec": {"replicas": replicas}}
        await self._write(
            wanted["kind"], server_name(self.name), lambda: self.ctx.kube.ensure(wanted, existing, patch=scale)
        )

    def _build(
        self,
        child: Child,
        index: int,
        run: m.RunRef,
        spec: DataGenRunSpec,
        image: str,
        data_generation: int,
        urls: list[str],
        taken_before: float | None = None,
    ) -> m.Manifest:
        match child:
            case Child.WORKER_ACCOUNT:
                return m.worker_service_account(run)
            case Child.WORKER_ROLE:
                return m.worker_role(run, spec.clients.shards)
            case Child.WORKER_ROLE_BINDING:
                return m.worker_role_binding(run)
            case Child.SHARD_PROGRESS:
                return m.shard_configmap(run, index)  # its data is the worker's, never drift
            case Child.HEADLESS_SERVICE:
                return m.headless_service(run, spec)
            case Child.REPLICA_SERVICE:
                return m.replica_service(run, spec, index)
            case Child.PREFLIGHT:
                return m.preflight_job(run, spec, image, data_generation)
            case Child.CANARY:
                return m.canary_job(run, spec, image, urls, data_generation)
            case Child.WORKERS:
                return m.workers_job(run, spec, image, urls, suspend=False)
            case Child.VERIFY:
                return m.verify_job(run, spec, image)
            case Child.EXPORT:
                return m.export_job(run, spec, image)
            case Child.RELEASE:
                return m.release_job(run, spec, image, taken_before)
        raise ValueError(f"{child} is not built by the operator, only scaled or deleted")

    def _kind_and_name(self, child: Child, index: int) -> tuple[str, str]:
        if child in JOBS:
            return "Job", JOBS[child][0](self.name)
        match child:
            case Child.SERVER_STATEFULSET:
                return "StatefulSet", server_name(self.name)
            case Child.SERVER_GROUP:
                return m.LWS_KIND, server_name(self.name)
            case Child.HEADLESS_SERVICE:
                return "Service", server_name(self.name)
            case Child.REPLICA_SERVICE:
                return "Service", server_pod_name(self.name, index)
        raise ValueError(f"{child} is never deleted by the operator (its owner reference removes it)")

    # --- report --------------------------------------------------------------------------------

    async def _report(
        self,
        body: Mapping[str, Any],
        old: DataGenRunStatus,
        decision: Decision,
        generation: int,
        now: datetime,
        extra: Iterable[ConditionUpdate],
        observed: Observed | None,
    ) -> None:
        conditions = apply_updates(old.conditions, [*decision.updates, *extra], now, generation)
        server = None
        if observed is not None and observed.server is not None:
            info = self.server_info or {}
            server = ServerStatus(
                endpoints=list(observed.server.ready_endpoints),
                ready_replicas=len(observed.server.ready_endpoints),
                replicas=observed.server.replicas_wanted if decision.server_wanted else 0,
                version=info.get("version") or (old.server.version if old.server else None),
                reasoning_parser=info.get("reasoning_parser") or (old.server.reasoning_parser if old.server else None),
                tool_call_parser=info.get("tool_call_parser") or (old.server.tool_call_parser if old.server else None),
            )
        finished = decision.finished
        status = DataGenRunStatus(
            observed_generation=generation,
            phase=decision.phase,
            conditions=conditions,
            progress=decision.progress,
            checks=list(decision.checks),
            fingerprint=o.fingerprint(self._children("ConfigMap")) or old.fingerprint,
            server=server,
            started_at=old.started_at or rfc3339(now),
            completed_at=(old.completed_at or rfc3339(now)) if finished else None,
            worker_image=self.worker_image or old.worker_image,
        )
        new = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        before = old.model_dump(mode="json", by_alias=True, exclude_none=True)
        metrics.observe_status(self.namespace, self.name, new)
        loop_time = asyncio.get_running_loop().time()
        only_progress = _signature(new) == _signature(before)
        settings = self.ctx.settings
        # Counts that moved go out every progress_write_s; words alone (a loading timer) every message_write_s.
        moved = new.get("progress") != before.get("progress")
        every = settings.progress_write_s if moved else max(settings.progress_write_s, settings.message_write_s)
        spacing = progress_spacing(every, len(self.ctx.wakers), settings.progress_writes_per_s)
        if only_progress and (new == before or not progress_write_due(self.last_write, loop_time, spacing)):
            return
        # Merge patch: keys set to None clear what this pass no longer reports.
        patch = {**{key: None for key in before if key not in new}, **new}
        await self.ctx.kube.patch_status(self.namespace, self.name, patch)
        self.status, self.last_write = new, loop_time
        for condition in conditions:
            previous = next((c for c in old.conditions if c.type == condition.type), None)
            if previous is None or (previous.status, previous.reason) != (condition.status, condition.reason):
                metrics.count_transition(condition.type, condition.status, condition.reason)
        for event in transition_events(old.conditions, conditions):
            await self._post_event(body, event)

    async def _post_event(self, body: Mapping[str, Any], event: Event) -> None:
        if not await post_run_event(self.ctx, body, event):
            self._let_go(f"the API server refused event {event.reason}")


async def post_run_event(ctx: OperatorContext, body: Mapping[str, Any], event: Event) -> bool:
    """One event on the run (a transition, a storage warning), logged as well: what a person reading the log
    needs. An event is auxiliary: refused or failed, it is not retried. False when the run's namespace is being
    deleted (it takes no new content), for the caller to stop the run."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    level = logging.WARNING if event.type == "Warning" else logging.INFO
    log.log(level, "%s/%s: %s", namespace, name, event.message)
    involved = {
        "apiVersion": body.get("apiVersion") or f"{API_GROUP}/{API_VERSION}",
        "kind": body.get("kind") or "DataGenRun",
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


def _signature(status: Mapping[str, Any]) -> dict[str, Any]:
    """What makes a status write urgent: everything but numbers and messages (a loading timer, a token rate,
    a check's rate over more records). Those ride along with the next write, or go out every progress_write_s;
    a check that flips (passed) or a condition that changes (status, reason) goes out at once."""
    out = {k: v for k, v in status.items() if k not in ("progress", "conditions", "checks")}
    out["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in status.get("conditions") or []]
    out["checks"] = [(c.get("name"), c.get("passed")) for c in status.get("checks") or []]
    return out


NAMESPACE_PROBE_S = 60.0
"""How often a run whose pods stay terminating (a pod on a node that is gone, say) asks again whether its
namespace is being deleted, when its pods did not change."""
LWS_MISSING = (
    "LeaderWorkerSet is not installed in this cluster (no leaderworkersets.leaderworkerset.x-k8s.io): a server over "
    "several nodes (server.nodes > 1) is a LeaderWorkerSet group; install LWS (docs/install.md) or set server.nodes "
    "to 1"
)


async def stop_children(kube: Kube, namespace: str, name: str) -> str | None:
    """The finalizer's work, one step per call: None when done, else what it waits for.

    Workers stop before the server so they drain (SIGTERM: finish in-flight, fsync) instead of failing on a
    vanished server. The garbage collector removes the rest through owner references; no volume is touched."""
    for job in (job_name(name) for job_name, _ in JOBS.values()):
        existing = await kube.read("Job", namespace, job)
        if existing is not None:
            if not (existing.get("metadata") or {}).get("deletionTimestamp"):
                await kube.delete("Job", namespace, job, propagation="Foreground")
            return f"waiting for Job {job} and its pods to stop"
    group = await kube.read(m.LWS_KIND, namespace, server_name(name))  # None too where LWS is not installed
    if group is not None:
        if not (group.get("metadata") or {}).get("deletionTimestamp"):
            await kube.delete(m.LWS_KIND, namespace, server_name(name), propagation="Foreground")
        return "waiting for the server groups to stop"
    sts = await kube.read("StatefulSet", namespace, server_name(name))
    if sts is not None:
        if not (sts.get("metadata") or {}).get("deletionTimestamp"):
            await kube.delete("StatefulSet", namespace, server_name(name), propagation="Foreground")
        return "waiting for the server pods to stop"
    return None
