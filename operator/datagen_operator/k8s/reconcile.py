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
from datagen_operator.api.live_fields import changed_data_fields, merge_live_fields
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
    SPEC_APPLIED,
    DataGenRunStatus,
    ServerStatus,
)
from datagen_operator.checks.evaluate import check_context
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
from datagen_operator.k8s import groups, metrics
from datagen_operator.k8s import manifests as m
from datagen_operator.k8s import observe as o
from datagen_operator.k8s.kube import Kube, drifted, namespace_terminating, refusal
from datagen_operator.k8s.settings import Settings

log = logging.getLogger("datagen.operator")

CHILDREN_ACCEPTED = "ChildrenAccepted"
"""Shown only once the API server refused a child (or a Job's pod): False, in its words, while any is refused."""

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

        spec, resolved, data_generation, refused = await self._apply_spec(run, spec, resolved, generation)
        self.worker_image = m.started_worker_image(
            old.worker_image, self._children("Job"), spec.clients.image, self.ctx.settings.worker_image
        )
        urls = m.server_urls(self.name, self.namespace, spec, self.ctx.settings.test_server_urls)
        context = check_context(resolved, spec.checks)  # no tokenizer here: the preset's think-end id
        halted = remembered_halt(old, generation)
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
        extra = []
        if refused:
            extra.append(
                ConditionUpdate(
                    SPEC_APPLIED,
                    "False",
                    "DataFieldsFrozen",
                    f"{', '.join(refused)} changed after bulk records were written; the run keeps its applied spec "
                    "so the output never mixes two configurations. Revert the change, or create a new run with a "
                    "new output path.",
                )
            )
        elif any(c.type == SPEC_APPLIED for c in old.conditions):
            extra.append(ConditionUpdate(SPEC_APPLIED, "True", "Applied", "the spec in force is the one written"))
        extra += children_accepted({**self.refused_writes, **self.refused_pods}, old)
        await self._report(body, old, decision, generation, now, extra, observed)
        return decision

    # --- spec ----------------------------------------------------------------------------------

    async def _apply_spec(
        self, run: m.RunRef, spec: DataGenRunSpec, resolved: ResolvedModel, generation: int
    ) -> tuple[DataGenRunSpec, ResolvedModel, int, list[str]]:
        """The spec in force (and its model), the generation of its data-affecting part, refused data changes."""
        name = spec_configmap_name(self.name)
        cm = self._named("ConfigMap", name) or await self.ctx.kube.read("ConfigMap", self.namespace, name)
        new = m.spec_document(spec)
        if cm is None:
            await self.ctx.kube.create(m.spec_configmap(run, spec, generation))
            return spec, resolved, generation, []
        applied = (yaml.safe_load((cm.get("data") or {}).get("run.yaml") or "{}") or {}).get("spec") or {}
        data_generation = int((cm["metadata"].get("annotations") or {}).get(m.DATA_GENERATION, generation))
        changed = changed_data_fields(new, applied)
        refused: list[str] = []
        if changed and self._bulk_started():
            refused = changed
            spec, resolved = parse_spec_resolved(merge_live_fields(new, applied))
            new = m.spec_document(spec)
        elif changed:
            data_generation = generation  # before bulk work a data change is fine: the steps run again
        if new != applied:
            manifest = m.spec_configmap(run, spec, data_generation)
            await self.ctx.kube.patch(
                "ConfigMap", self.namespace, name, {"metadata": manifest["metadata"], "data": manifest["data"]}
            )
        return spec, resolved, data_generation, refused

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
        preflight_job = self._named("Job", preflight_job_name(self.name))
        if preflight_job is not None and _annotation(preflight_job, m.DATA_GENERATION) != str(data_generation):
            preflight_job = None  # made for an older spec: its verdict does not apply
        # A verdict once recorded stands for this data generation: its pod may be gone (users, pod GC) and a
        # Job without its pod would read as "no verdict".
        preflight = remembered_preflight(old, data_generation) or o.job_outcome(
            preflight_job, self._pods("preflight"), "preflight", "preflight"
        )
        canary_job = self._named("Job", canary_job_name(self.name))
        if canary_job is not None and _annotation(canary_job, m.DATA_GENERATION) != str(data_generation):
            canary_job = None  # made for an older spec: its verdict does not apply
        canary = remembered_outcome(old.conditions, CANARY_PASSED, data_generation, checks) or o.job_outcome(
            canary_job, self._pods("canary"), "canary", "canary"
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
        kube = self.ctx.kube
        shards = spec.clients.shards
        for manifest in (m.worker_service_account(run), m.worker_role(run, shards), m.worker_role_binding(run)):
            await self._apply(manifest)
        for index in range(shards):
            await self._apply(m.shard_configmap(run, index))  # its data is the worker's, never drift
        grouped = spec.server.nodes > 1
        sts = self._named("StatefulSet", server_name(self.name))
        if grouped and sts is not None:
            # server.nodes went above 1: the single-node server and its headless Service make way for the group
            # (LWS makes its own headless Service, one that publishes not-ready leaders to their workers).
            await kube.delete("StatefulSet", self.namespace, server_name(self.name))
            await kube.delete("Service", self.namespace, server_name(self.name))
            sts = None
        if not grouped and any(o.is_group_worker(p, server_name(self.name)) for p in self._pods("server")):
            await kube.delete(m.LWS_KIND, self.namespace, server_name(self.name))  # server.nodes went back to 1
        if not grouped:
            await self._apply(m.headless_service(run, spec))
        for index in range(spec.server.replicas):
            await self._apply(m.replica_service(run, spec, index))
        # A scale-down leaves Services of replicas that no longer exist.
        workload = self.group_set if grouped else sts
        had = int((workload or {}).get("spec", {}).get("replicas") or 0)
        for index in range(spec.server.replicas, had):
            await kube.delete("Service", self.namespace, server_pod_name(self.name, index))

        replicas = spec.server.replicas if decision.server_wanted else 0
        if workload is not None or decision.server_wanted:
            wanted: Mapping[str, Any] = with_restart_hash(m.server_workload(run, spec, replicas, resolved))
            if workload is not None and o.holds_a_node(self._pods("server")) and not needs_restart(wanted, workload):
                # Only live fields moved while a server holds its GPUs (a model load): the running template
                # stays, only the replica count may move; the change reaches the next server start.
                wanted = workload
            scale = {"spec": {"replicas": replicas}}
            await self._write(
                wanted["kind"], server_name(self.name), lambda: kube.ensure(dict(wanted), workload, patch=scale)
            )

        if observed.halted is None:
            for step_job, component, verdict in (
                (preflight_job_name(self.name), "preflight", observed.preflight),
                (canary_job_name(self.name), "canary", observed.canary),
                (verify_job_name(self.name), "verify", observed.final),
                (export_job_name(self.name), "export", observed.export),
            ):
                if verdict is None and o.job_lost(self._named("Job", step_job), self._pods(component)):
                    # Its pods went before their verdict was read (the operator was away): the step runs again,
                    # rather than read as a failure. A recorded verdict never gets here (remembered first).
                    log.info(
                        "%s/%s: Job %s ended, its pods gone unread: it runs again", self.namespace, self.name, step_job
                    )
                    await kube.delete("Job", self.namespace, step_job)
        image = spec.clients.image or self.worker_image or self.ctx.settings.worker_image
        preflight = self._named("Job", preflight_job_name(self.name))
        if preflight is not None and _annotation(preflight, m.DATA_GENERATION) != str(data_generation):
            await kube.delete("Job", self.namespace, preflight_job_name(self.name))
        elif decision.step == Step.PREFLIGHT and preflight is None:
            await self._create(m.preflight_job(run, spec, image, data_generation))

        canary = self._named("Job", canary_job_name(self.name))
        stale_canary = canary is not None and _annotation(canary, m.DATA_GENERATION) != str(data_generation)
        if canary is not None and (stale_canary or (decision.step == Step.SUSPENDED and not o.job_finished(canary))):
            await kube.delete("Job", self.namespace, canary_job_name(self.name))
        elif decision.canary_wanted and canary is None and observed.server:
            ready = list(observed.server.ready_endpoints) or urls
            await self._create(m.canary_job(run, spec, image, ready, data_generation))

        workers = self._named("Job", workers_job_name(self.name))
        if workers is None and decision.workers_wanted:
            await self._create(m.workers_job(run, spec, image, urls, suspend=False))
        elif workers is not None and not o.job_finished(workers):
            if _annotation(workers, m.SERVER_URLS) != ",".join(urls):
                # The server list changed (replicas): workers drain, a new Job resumes every shard.
                await kube.delete("Job", self.namespace, workers_job_name(self.name))
            elif bool(workers["spec"].get("suspend")) != (not decision.workers_wanted):
                await kube.patch(
                    "Job",
                    self.namespace,
                    workers_job_name(self.name),
                    {"spec": {"suspend": not decision.workers_wanted}},
                )

        if decision.step == Step.FINAL_VERIFY and self._named("Job", verify_job_name(self.name)) is None:
            await self._create(m.verify_job(run, spec, image))
        if decision.step == Step.EXPORT and self._named("Job", export_job_name(self.name)) is None:
            await self._create(m.export_job(run, spec, image))

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
        if only_progress and (new == before or loop_time - self.last_write < self.ctx.settings.progress_write_s):
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
        """One transition: logged (what a person reading the log needs) and posted as an event on the run. An
        event is auxiliary: refused or failed, it is not retried, and a namespace being deleted stops the run."""
        level = logging.WARNING if event.type == "Warning" else logging.INFO
        log.log(level, "%s/%s: %s", self.namespace, self.name, event.message)
        meta = body["metadata"]
        involved = {
            "apiVersion": body.get("apiVersion") or f"{API_GROUP}/{API_VERSION}",
            "kind": body.get("kind") or "DataGenRun",
            "name": self.name,
            "namespace": self.namespace,
            "uid": meta["uid"],
        }
        component, instance = self.ctx.reporter
        try:
            await self.ctx.kube.post_event(
                involved, event.type, event.reason, event.message, component=component, instance=instance
            )
        except ApiException as error:
            if namespace_terminating(error):
                self._let_go(f"the API server refused event {event.reason}")
            elif error.status not in (404, 409):  # 404: the run or its namespace is gone; 409: a name clash
                log.warning("%s/%s: event %s not posted: %s", self.namespace, self.name, event.reason, error.reason)
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("%s/%s: event %s not posted: %r", self.namespace, self.name, event.reason, error)


def _signature(status: Mapping[str, Any]) -> dict[str, Any]:
    """What makes a status write urgent: everything but numbers and messages (a loading timer, a token rate,
    a check's rate over more records). Those ride along with the next write, or go out every progress_write_s;
    a check that flips (passed) or a condition that changes (status, reason) goes out at once."""
    out = {k: v for k, v in status.items() if k not in ("progress", "conditions", "checks")}
    out["conditions"] = [{k: v for k, v in c.items() if k != "message"} for c in status.get("conditions") or []]
    out["checks"] = [(c.get("name"), c.get("passed")) for c in status.get("checks") or []]
    return out


def children_accepted(refused: Mapping[str, str], old: DataGenRunStatus) -> list[ConditionUpdate]:
    """ChildrenAccepted: False while the API server refuses a child or a Job's pod, in its own words; True once
    none is refused (only when it was shown before: a run that never had a refusal carries no such condition)."""
    if refused:
        message = "; ".join(f"{key}: {words}" for key, words in sorted(refused.items()))
        return [ConditionUpdate(CHILDREN_ACCEPTED, "False", "Refused", message[:2000])]
    if any(c.type == CHILDREN_ACCEPTED for c in old.conditions):
        return [
            ConditionUpdate(CHILDREN_ACCEPTED, "True", "Accepted", "the API server accepted every child of the run")
        ]
    return []


NAMESPACE_PROBE_S = 60.0
"""How often a run whose pods stay terminating (a pod on a node that is gone, say) asks again whether its
namespace is being deleted, when its pods did not change."""
RESTART_HASH = f"{m.API_GROUP}/restart-hash"
LWS_MISSING = (
    "LeaderWorkerSet is not installed in this cluster (no leaderworkersets.leaderworkerset.x-k8s.io): a server over "
    "several nodes (server.nodes > 1) is a LeaderWorkerSet group; install LWS (docs/install.md) or set server.nodes "
    "to 1"
)
LIVE_POD_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName")
"""The server pod template's live parts (spec.server's placement): a running server keeps the template it
started with; a change reaches the next server start (or at once, while no server pod holds a node)."""


def with_restart_hash(workload: m.Manifest) -> m.Manifest:
    """The StatefulSet (or a group's LeaderWorkerSet) annotated with the hash of what needs a server restart:
    its pod templates without the live fields."""
    if workload["kind"] == m.LWS_KIND:
        group = workload["spec"]["leaderWorkerTemplate"]
        templates = [group["leaderTemplate"], group["workerTemplate"]]
    else:
        templates = [workload["spec"]["template"]]
    restart = [{**t, "spec": {k: v for k, v in t["spec"].items() if k not in LIVE_POD_FIELDS}} for t in templates]
    digest = m.template_hash(restart[0] if len(restart) == 1 else restart)
    annotations = {**workload["metadata"].get("annotations", {}), RESTART_HASH: digest}
    return {**workload, "metadata": {**workload["metadata"], "annotations": annotations}}


def needs_restart(wanted: Mapping[str, Any], existing: Mapping[str, Any]) -> bool:
    """A change beyond the live fields (image, args, resources, volumes): the server must restart for it."""
    return _annotation(wanted, RESTART_HASH) != _annotation(existing, RESTART_HASH)


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(key)


async def stop_children(kube: Kube, namespace: str, name: str) -> str | None:
    """The finalizer's work, one step per call: None when done, else what it waits for.

    Workers stop before the server so they drain (SIGTERM: finish in-flight, fsync) instead of failing on a
    vanished server. The garbage collector removes the rest through owner references; no volume is touched."""
    jobs = (workers_job_name, preflight_job_name, canary_job_name, verify_job_name, export_job_name)
    for job in (job_name(name) for job_name in jobs):
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
