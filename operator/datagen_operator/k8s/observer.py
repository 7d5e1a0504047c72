"""Everything a pass reads, as observed facts (control/observed.py `Observed`): the I/O half of observing, whose
pure mapping of the objects is k8s/object_facts.py. The watch cache's children, the server's own answers
(health, and its parsers while they are to be verified), the LeaderWorkerSet, the controllers' FailedCreate
events, the spec-in-force ConfigMap and whether the namespace is being deleted. Verdicts the status already
records stand for their data generation (control/remembered.py): the pod that said one may be gone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api.names import Component, server_name, spec_configmap_name, workers_job_name
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import EXPORTED, PARSERS_VERIFIED, DataGenRunStatus, Phase
from datagen_operator.control.decide import parsers_to_read
from datagen_operator.control.observed import (
    JobWorkload,
    KueueEvicted,
    KueueQueued,
    Observed,
    ProbeFailures,
    ServerInstance,
    ServerObservation,
)
from datagen_operator.control.remembered import (
    canary_in_force,
    remembered_canary,
    remembered_final,
    remembered_outcome,
    remembered_preflight,
    remembered_workers,
)
from datagen_operator.k8s import groups, job_manifests, object_meta
from datagen_operator.k8s import object_facts as o
from datagen_operator.k8s.children import Child, made_for
from datagen_operator.k8s.context import OperatorContext, RunCache
from datagen_operator.k8s.kube import Kube
from datagen_operator.k8s.object_facts import annotation
from datagen_operator.k8s.registry import JOBS, child_name

log = logging.getLogger("datagen.operator")

NAMESPACE_PROBE_S = 60.0
"""How often a run whose pods stay terminating (a pod on a node that is gone, say) asks again whether its
namespace is being deleted, when its pods did not change."""


KUEUE_UNREAD = {
    404: "spec.queue has no effect: Kueue is not installed (no Workload API), so nothing queues the server",
    403: "Kueue's Workloads cannot be read: the operator may not list workloads.kueue.x-k8s.io (its RBAC), so "
    "whether Kueue holds the server is not known",
}
"""What a run says beside ServerReady when its server carries Kueue's queue label and the Workloads cannot be read,
by the API server's answer."""


@dataclass(frozen=True)
class AppliedSpec:
    """The spec-in-force ConfigMap as read this pass (None: the run has none yet)."""

    configmap: Mapping[str, Any] | None
    document: dict[str, Any] | None = None
    data_generation: int | None = None
    changed_generation: int | None = None


@dataclass
class KueueWorkloads:
    """The namespace's Kueue Workloads, listed at most once a pass (the server's and the Jobs' from the same list):
    not watched, so the operator runs where Kueue is not installed. `unreadable`: the API server's refusal (404:
    Kueue not installed, 403: no RBAC), after which the pass reads none."""

    kube: Kube
    namespace: str
    listed: list[Mapping[str, Any]] | None = None
    unreadable: int | None = None

    async def get(self) -> list[Mapping[str, Any]] | None:
        """The Workloads, or None where the Workload API refused."""
        if self.listed is None and self.unreadable is None:
            try:
                self.listed = await self.kube.kueue_workloads(self.namespace)
            except ApiException as error:
                if error.status not in (403, 404):
                    raise
                self.unreadable = error.status
        return self.listed


@dataclass
class Observer:
    """One run's observation, with what it keeps between passes."""

    ctx: OperatorContext
    cache: RunCache
    parser_probes: ProbeFailures = field(default_factory=ProbeFailures)
    """Failed reads of the server's parsers (control.policy bounds them; decide() turns too many into a halt)."""
    server_info: dict[str, Any] | None = None
    """The server's /server_info, once read."""
    group_set: Mapping[str, Any] | None = None
    """The run's LeaderWorkerSet (server.nodes > 1), read once per pass: the operator does not watch them, so it
    runs where LWS is not installed."""
    refused_pods: dict[str, str] = field(default_factory=dict)
    """'Job/name' -> why its controller could not create a pod (FailedCreate), as of this pass."""
    probed: tuple[frozenset[tuple[str, bool]], float] | None = None
    """The run's pods (uid, terminating) when the namespace was last asked whether it is being deleted, and when."""
    kueue_unreadable: int | None = None
    """The HTTP status with which the Workload API refused (404: Kueue not installed), once warned about."""
    unanswered_since: datetime | None = None
    """server.external: when this operator first saw none of its URLs answer (None: one answers)."""
    preemptors: dict[str, str] = field(default_factory=dict)
    """A preempting Workload's UID -> who it is, by name (`_preempted_for`): read once."""

    @property
    def namespace(self) -> str:
        return self.cache.namespace

    @property
    def name(self) -> str:
        return self.cache.name

    async def namespace_deleted(self) -> bool:
        """Whether the namespace is being deleted, asked only while some pod of the run is terminating (a
        namespace's deletion starts with its pods): again when the run's pods change, else once a minute."""
        pods = frozenset(
            (p["metadata"]["uid"], bool(p["metadata"].get("deletionTimestamp"))) for p in self.cache.children("Pod")
        )
        if not any(terminating for _, terminating in pods):
            return False
        now = asyncio.get_running_loop().time()
        if self.probed is not None and self.probed[0] == pods and now - self.probed[1] < NAMESPACE_PROBE_S:
            return False
        self.probed = (pods, now)
        return not await self.ctx.kube.takes_new_content(self.namespace)

    async def applied_spec(self) -> AppliedSpec:
        name = spec_configmap_name(self.name)
        cm = self.cache.named("ConfigMap", name) or await self.ctx.kube.read("ConfigMap", self.namespace, name)
        if cm is None:
            return AppliedSpec(None)
        document = (yaml.safe_load((cm.get("data") or {}).get("run.yaml") or "{}") or {}).get("spec") or {}
        recorded, changed = (
            annotation(cm, object_meta.DATA_GENERATION),
            annotation(cm, object_meta.SPEC_CHANGED_GENERATION),
        )
        return AppliedSpec(
            cm, document, int(recorded) if recorded is not None else None, int(changed) if changed is not None else None
        )

    def bulk_started(self) -> bool:
        """The workers' Job exists, or the workers wrote progress: a finished workers' Job deleted by hand does not
        make the output's records unwritten."""
        if self.cache.named("Job", workers_job_name(self.name)) is not None:
            return True
        return bool(o.shard_snapshots(self.cache.children("ConfigMap")))

    def worker_image(self, recorded: str | None, spec: DataGenRunSpec) -> str:
        return job_manifests.started_worker_image(
            recorded, self.cache.children("Job"), spec.clients.image, self.ctx.settings.worker_image
        )

    def fingerprint(self) -> str | None:
        return o.fingerprint(self.cache.children("ConfigMap"))

    async def observe(
        self,
        spec: DataGenRunSpec,
        resolved: ResolvedModel,
        generation: int,
        data_generation: int,
        old: DataGenRunStatus,
        urls: list[str],
        now: datetime,
        refused_writes: Mapping[str, str],
    ) -> Observed:
        """The pass's facts; the server's parsers are read when `parsers_to_read` says they are due."""
        workloads = KueueWorkloads(self.ctx.kube, self.namespace)
        server = await self._server(spec, urls, now, refused_writes, workloads)
        self.refused_pods = {}
        for job in self.cache.children("Job"):
            if o.job_without_pods(job) and (words := await self._pod_refusal(job)):
                self.refused_pods[f"Job/{job['metadata']['name']}"] = words
        observed = self._steps(spec, generation, data_generation, old, server)
        observed = replace(observed, job_workloads=await self._job_workloads(spec, workloads))
        if parsers_to_read(spec, observed):
            assert observed.server is not None
            outcome = await self._verify_parsers(spec, resolved, observed.server.ready_endpoints)
            observed = replace(observed, parsers=outcome, parser_probes=self.parser_probes)
        return observed

    async def _server(
        self,
        spec: DataGenRunSpec,
        urls: list[str],
        now: datetime,
        refused_writes: Mapping[str, str],
        workloads: KueueWorkloads,
    ) -> ServerObservation:
        if spec.server.external is not None:
            return await self._external(urls, now)
        self.unanswered_since = None
        sts_name = server_name(self.name)
        server_pods = self.cache.pods(Component.SERVER)
        statefulset = self.cache.named("StatefulSet", sts_name)
        grouped = spec.server.nodes > 1
        if grouped:
            self.group_set = await self.ctx.kube.read(object_meta.LWS_KIND, self.namespace, sts_name)
        # A group's leader is <run>-server-<i>, as a single-node server pod is: the same probes, the same URLs.
        serving = self.group_set if grouped else statefulset
        probe = o.pods_to_probe(server_pods, sts_name, spec.server.replicas) if serving is not None else []
        answers = await asyncio.gather(*(self._healthy(urls[index]) for _, index in probe))
        health = {pod: ok for (pod, _), ok in zip(probe, answers, strict=True)}
        if grouped:
            refused = refused_writes.get(f"{object_meta.LWS_KIND}/{sts_name}")
            leaders = {"metadata": {"name": sts_name}} if self.group_set is not None else None
            observation = groups.group_observation(
                server_pods, leaders, spec.server.replicas, spec.server.nodes, urls, health, now, refused
            )
        else:
            refused = None
            if statefulset is not None and o.statefulset_short(statefulset, server_pods):
                refused = await self._pod_refusal(statefulset)
            observation = o.server_observation(
                server_pods, statefulset, spec.server.replicas, urls, health, now, refused
            )
        local_queue = o.kueue_local_queue(serving) if serving is not None else None
        if serving is None or local_queue is None:  # a server Kueue does not manage: Kueue's API is not read
            return observation
        queued, evicted = await self._kueue(local_queue, serving, server_pods, workloads)
        unread = KUEUE_UNREAD.get(self.kueue_unreadable) if self.kueue_unreadable is not None else None
        return replace(observation, queued=queued, evicted=evicted, kueue_unread=unread)

    async def _external(self, urls: list[str], now: datetime) -> ServerObservation:
        """server.external: its URLs probed, no pod read (the run has none); `loading_seconds` counts from the
        first pass in which none answered."""
        answers = await asyncio.gather(*(self._healthy(url) for url in urls))
        if any(answers):
            self.unanswered_since = None
        elif self.unanswered_since is None:
            self.unanswered_since = now
        waited = (now - self.unanswered_since).total_seconds() if self.unanswered_since is not None else None
        instances = tuple(
            ServerInstance(url, running=True, ready=ok, loading_seconds=None if ok else waited, endpoint=url)
            for url, ok in zip(urls, answers, strict=True)
        )
        return ServerObservation(len(urls), instances, external=True)

    async def _kueue(
        self,
        local_queue: str,
        serving: Mapping[str, Any],
        server_pods: list[Mapping[str, Any]],
        listed: KueueWorkloads,
    ) -> tuple[tuple[KueueQueued, ...], tuple[KueueEvicted, ...]]:
        """The server's Kueue Workloads not admitted yet, and those Kueue evicted (preempted) and has not admitted
        again, from one list each pass (not watched: admission lifts the scheduling gate of the server's pods, and
        an eviction deletes them, whose watch wakes the pass). Where the Workload API cannot be read (Kueue not
        installed, or the chart's RBAC predates it) the run goes on as without a queue, said once."""
        everything = await listed.get()
        if everything is None:
            assert listed.unreadable is not None
            if self.kueue_unreadable != listed.unreadable:
                log.warning(
                    "%s/%s: the server is in Kueue's LocalQueue %s (spec.queue, or the namespace's default) but "
                    "Kueue's Workloads (%s) cannot be read: %s",
                    self.namespace,
                    self.name,
                    local_queue,
                    object_meta.KUEUE_API_VERSION,
                    KUEUE_UNREAD[listed.unreadable],
                )
                self.kueue_unreadable = listed.unreadable
            return (), ()
        owner = serving["metadata"]["uid"]
        workloads = [
            w for w in everything if any(ref.get("uid") == owner for ref in w["metadata"].get("ownerReferences") or [])
        ]
        self.kueue_unreadable = None
        queued: list[KueueQueued] = []
        evicted: list[KueueEvicted] = []
        cluster_queues: dict[str, str | None] = {}

        async def cluster_queue(local: str) -> str | None:
            if local not in cluster_queues:
                cluster_queues[local] = await self.ctx.kube.kueue_cluster_queue(self.namespace, local)
            return cluster_queues[local]

        for workload in sorted(workloads, key=lambda w: w["metadata"]["name"]):
            waiting = o.kueue_queued(workload)
            if waiting is not None and waiting.cluster_queue is None and waiting.local_queue:
                waiting = replace(waiting, cluster_queue=await cluster_queue(waiting.local_queue))
            if waiting is not None:
                queued.append(waiting)
            gone = o.kueue_evicted(workload)
            if gone is not None and gone.cluster_queue is None and gone.local_queue:
                gone = replace(gone, cluster_queue=await cluster_queue(gone.local_queue))
            if gone is not None:
                preemptor = o.preemptor_ids(gone.message)
                if preemptor is not None:
                    gone = replace(gone, preempted_for=await self._preempted_for(*preemptor, everything))
                evicted.append(gone)
        if not queued and not evicted and any(o.kueue_gated(pod) for pod in server_pods):
            # Kueue gated the pods before its Workload was read, or admitted it and is lifting the gates now.
            words = "admitted; Kueue is lifting its gate" if workloads else "waiting for Kueue to make its Workload"
            queued.append(KueueQueued(workload="", local_queue=local_queue, message=words))
        return tuple(queued), tuple(evicted)

    async def _preempted_for(self, workload_uid: str, job_uid: str, listed: list[Mapping[str, Any]]) -> str:
        """Who a preemption made room for, by name: Kueue's message names the preempting Workload by its UID and
        its job's. The Workload is in this namespace's list, or found by its job-uid label in any namespace (a
        cohort spans namespaces); its owner (a run's server or Job) is read for the DataGenRun that owns it. Found
        once per preemptor; empty while it cannot be found (it went, or may not be read)."""
        if workload_uid in self.preemptors:
            return self.preemptors[workload_uid]
        found = next((w for w in listed if w["metadata"].get("uid") == workload_uid), None)
        try:
            if found is None and job_uid != "UNKNOWN":
                of_job = await self.ctx.kube.kueue_workloads_of_job(job_uid)
                found = next((w for w in of_job if w["metadata"].get("uid") == workload_uid), None)
            if found is None:
                return ""
            meta = found["metadata"]
            words = f"Workload {meta.get('namespace')}/{meta.get('name')}"
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") not in ("StatefulSet", "Job", object_meta.LWS_KIND):
                    continue
                owner = await self.ctx.kube.read(ref["kind"], meta.get("namespace") or self.namespace, ref["name"])
                run = o.owner_run(owner) if owner is not None else None
                words = f"DataGenRun {run}" if run else f"{ref['kind']} {meta.get('namespace')}/{ref['name']}"
                break
        except ApiException as error:
            log.info("%s/%s: the preempting workload %s not read: %s", self.namespace, self.name, workload_uid, error)
            return ""
        self.preemptors[workload_uid] = words
        return words

    async def _job_workloads(self, spec: DataGenRunSpec, listed: KueueWorkloads) -> dict[str, JobWorkload]:
        """The Kueue Workloads of the run's unfinished Jobs, by the planner's name of the Job, from the pass's list
        (labelled kueue.x-k8s.io/job-uid), read only where Kueue may hold one: spec.queue is set, or a Job carries Kueue's queue label or is suspended (Kueue
        suspends a Job it manages without a queue label in a namespace where it manages every Job). Where the
        Workload API cannot be read, none: the Jobs go on as without Kueue (the server's reading says so)."""
        jobs = {
            job["metadata"]["uid"]: job
            for job in self.cache.children("Job")
            if o.job_finished(job) is None and job["metadata"].get("uid")
        }
        if spec.queue is None and not any(
            object_meta.KUEUE_QUEUE_LABEL in (job["metadata"].get("labels") or {})
            or (job.get("spec") or {}).get("suspend")
            for job in jobs.values()
        ):
            return {}
        if not jobs:
            return {}
        workloads = await listed.get()
        if workloads is None:
            return {}
        children = {child_name(child, self.name): child for child in JOBS}
        found: dict[str, JobWorkload] = {}
        for workload in sorted(workloads, key=lambda w: w["metadata"]["name"]):
            job = jobs.get((workload["metadata"].get("labels") or {}).get(object_meta.KUEUE_JOB_UID_LABEL) or "")
            child = children.get(job["metadata"]["name"]) if job is not None else None
            if child is None or (workload["metadata"].get("deletionTimestamp")):
                continue
            waiting = o.kueue_queued(workload)
            if waiting is not None and waiting.cluster_queue is None and waiting.local_queue:
                cluster_queue = await self.ctx.kube.kueue_cluster_queue(self.namespace, waiting.local_queue)
                waiting = replace(waiting, cluster_queue=cluster_queue)
            active = (workload.get("spec") or {}).get("active") is not False
            found[child] = JobWorkload(workload["metadata"]["name"], active=active, queued=waiting)
        return found

    def _steps(
        self,
        spec: DataGenRunSpec,
        generation: int,
        data_generation: int,
        old: DataGenRunStatus,
        server: ServerObservation,
    ) -> Observed:
        """The step Jobs' verdicts and the workers' counts. A verdict once recorded stands for this data
        generation: its pod may be gone (users, pod GC) and a Job without its pod would read as "no verdict"."""
        checks = old.checks
        job = self._job

        def current(child: Child) -> Mapping[str, Any] | None:
            made = job(child)
            return (
                made
                if made is not None and made_for(annotation(made, object_meta.DATA_GENERATION), data_generation)
                else None
            )

        def outcome(made: Mapping[str, Any] | None, component: Component, what: str) -> StepOutcome | None:
            return o.job_outcome(made, self.cache.pods(component), component, what)

        workers_job = job(Child.WORKERS)
        configmaps = self.cache.children("ConfigMap")
        # A finished workers' Job deleted before the final verdict: its count stands (the status kept it).
        workers = o.workers_observation(workers_job, self.cache.pods(Component.WORKER), spec.clients.shards)
        workers = workers or remembered_workers(old.progress, spec.clients.shards)
        return Observed(
            generation=generation,
            suspended=spec.suspend,
            preflight=remembered_preflight(old, data_generation)
            or outcome(current(Child.PREFLIGHT), Component.PREFLIGHT, "preflight"),
            server=server,
            parsers=remembered_outcome(old.conditions, PARSERS_VERIFIED, data_generation, checks),
            parser_probes=self.parser_probes,
            canary=canary_in_force(
                remembered_canary(old, data_generation),
                outcome(current(Child.CANARY), Component.CANARY, "canary"),
                resumed_before_workers=old.phase == Phase.SUSPENDED and not spec.suspend and workers is None,
            ),
            workers=workers,
            progress=o.progress_counters(configmaps, workers_job),
            final=remembered_final(old.conditions, data_generation, checks)
            or outcome(job(Child.VERIFY), Component.VERIFY, "verification"),
            export=remembered_outcome(old.conditions, EXPORTED, data_generation)
            or outcome(job(Child.EXPORT), Component.EXPORT, "export"),
        )

    def _job(self, child: Child) -> Mapping[str, Any] | None:
        return self.cache.named("Job", child_name(child, self.name))

    async def _pod_refusal(self, controller: Mapping[str, Any]) -> str | None:
        """Why the StatefulSet or Job controller could not create a pod, from its FailedCreate event."""
        return o.creation_refusal(await self.ctx.kube.events_about(self.namespace, controller["metadata"]["uid"]))

    async def _healthy(self, url: str) -> bool:
        from datagen_operator.engine.client.reads import is_healthy

        return await is_healthy(self.ctx.http, url)

    async def _verify_parsers(
        self, spec: DataGenRunSpec, resolved: ResolvedModel, urls: tuple[str, ...]
    ) -> StepOutcome | None:
        """Each ready server's own word (/server_info) and a chat probe; a failed read is counted for decide()."""
        from datagen_operator.steps.parser_check import verify_running_servers

        try:
            outcome, info = await verify_running_servers(self.ctx.http, urls, spec, resolved)
        except Exception as error:  # the server is ready by its probes: decide() bounds the retries
            log.warning("%s/%s: reading the server's parsers failed: %s", self.namespace, self.name, error)
            self.parser_probes = ProbeFailures(self.parser_probes.count + 1, f"{', '.join(urls)}: {error}")
            return None
        self.server_info = info
        self.parser_probes = ProbeFailures()
        return outcome
