"""The run's children as the planner sees them (k8s/children.py `Children`), read from the watch cache's
objects: which exist, for which data generation, finished or not, whether their pods are gone."""

from __future__ import annotations

from collections.abc import Sequence

from datagen_operator.api.names import Component, server_name
from datagen_operator.k8s import object_facts as o
from datagen_operator.k8s import object_meta
from datagen_operator.k8s.children import Children, JobState
from datagen_operator.k8s.object_facts import Obj, annotation
from datagen_operator.k8s.registry import JOBS, REGISTRY


def job_state(job: Obj, pods: Sequence[Obj]) -> JobState:
    return JobState(
        data_generation=annotation(job, object_meta.DATA_GENERATION),
        finished=o.job_finished(job) is not None,
        failed=o.job_finished(job) == "Failed",
        pods_gone=o.job_lost(job, pods),
        suspended=bool((job.get("spec") or {}).get("suspend")),
        server_urls=annotation(job, object_meta.SERVER_URLS),
        queue_name=(job["metadata"].get("labels") or {}).get(object_meta.KUEUE_QUEUE_LABEL),
    )


def inventory(
    run: str,
    jobs: Sequence[Obj],
    pods: Sequence[Obj],
    statefulset: Obj | None,
    group: Obj | None,
    *,
    grouped: bool,
) -> Children:
    """`pods` are all the run's pods; `group` is its LeaderWorkerSet (read by the shell when server.nodes > 1)."""
    by_name = {job["metadata"]["name"]: job for job in jobs}

    def component(label: Component) -> list[Obj]:
        return [p for p in pods if (p["metadata"].get("labels") or {}).get(object_meta.COMPONENT_LABEL) == label]

    states = {
        child: job_state(by_name[name], component(REGISTRY[child].component))
        for child in JOBS
        if (name := REGISTRY[child].name(run, 0)) in by_name
    }
    server_pods = component(Component.SERVER)
    workload = group if grouped else statefulset
    return Children(
        jobs=states,
        statefulset=statefulset is not None,
        group=group is not None,
        group_workers_left=any(o.is_group_worker(p, server_name(run)) for p in server_pods),
        server_replicas=int(((workload or {}).get("spec") or {}).get("replicas") or 0),
        server_holds_a_node=o.holds_a_node(server_pods),
        server_restart_hash=annotation(workload, object_meta.RESTART_HASH),
        server_admission_hash=annotation(workload, object_meta.ADMISSION_HASH),
        server_kueue_managed=workload is not None and o.kueue_local_queue(workload) is not None,
    )
