"""The run's Jobs: the step Jobs (preflight, canary, verify, export, release-lease) from one table with one
failure policy, and the workers' Indexed Job. Pure."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from datagen_operator.api.commands import (
    CanaryCommand,
    Command,
    ExportCommand,
    PreflightCommand,
    ReleaseLeaseCommand,
    VerifyCommand,
    WorkerCommand,
)
from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT, WORKER_GRACE_S
from datagen_operator.api.export_spec import whole_conversations_asked
from datagen_operator.api.names import (
    Component,
    canary_job_name,
    export_job_name,
    preflight_job_name,
    release_job_name,
    shard_configmap_name,
    verify_job_name,
    worker_account_name,
    workers_job_name,
)
from datagen_operator.api.output_files import CANARY_RECORDS
from datagen_operator.api.paths import dataset_file, export_dir, output_dir
from datagen_operator.api.spec import (
    AUTO_CONCURRENCY,
    DataGenRunSpec,
)
from datagen_operator.control.policy import FREE_EXITS, PERMANENT_EXITS, SHARD_RETRIES
from datagen_operator.k8s.object_meta import (
    DATA_GENERATION,
    SERVER_URLS,
    TEMPLATE_HASH,
    Manifest,
    RunRef,
    kueue_labels,
    labels,
    object_metadata,
    template_hash,
)
from datagen_operator.k8s.pod_parts import (
    SCRATCH_HOME,
    SCRATCH_SIZE,
    client_placement,
    client_resources,
    datagen_pod_security,
    dataset_and_output_volumes,
    model_volume,
    no_privileges,
    run_file_volume,
)
from datagen_operator.k8s.pod_paths import RUN_FILE, TERMINATION_LOG


def _job(
    run: RunRef,
    spec: DataGenRunSpec,
    name: str,
    component: Component,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    job_spec: dict[str, Any],
    *,
    service_account: str | None = None,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a podFailurePolicy needs it; the Job makes a new pod instead
        "enableServiceLinks": False,
        "automountServiceAccountToken": service_account is not None,
        "securityContext": datagen_pod_security(),
        "containers": [container],
        "volumes": [*volumes, {"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_SIZE}}],
        **client_placement(spec),
    }
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    template = {"metadata": {"labels": labels(run.name, component)}, "spec": pod_spec}
    meta_annotations = {TEMPLATE_HASH: template_hash(template), **(annotations or {})}
    meta = object_metadata(run, name, component, meta_annotations)
    # Queued as the server is: where Kueue manages Jobs, every Job of the run waits in the same LocalQueue
    # (docs/kueue.md, "The run's CPU Jobs").
    meta["labels"].update(kueue_labels(spec))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {**job_spec, "template": template}}


def started_worker_image(
    recorded: str | None, jobs: Iterable[Mapping[str, Any]], spec_image: str | None, operator_image: str
) -> str:
    """The operator's worker image a run started with, which all its pods keep (status.workerImage): an
    operator upgrade mid-run must not leave workers on one image and verify on another. `recorded` in the
    run's first status write, before any child; for a run whose status was lost (restored without it), the
    image of its first Job (unless that was spec.clients.image's, which says nothing of the operator's);
    else, for a new run, the operator's now."""
    if recorded:
        return recorded
    first = min(jobs, key=lambda job: str(job["metadata"].get("creationTimestamp") or ""), default=None)
    if first is not None and not spec_image:
        containers = ((first.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        if containers and containers[0].get("image"):
            return str(containers[0]["image"])
    return operator_image


def _datagen_container(
    name: Component, image: str, command: Command, mounts: list[dict[str, Any]], spec: DataGenRunSpec
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": str(name),
        "image": image,
        "command": ["datagen", *command.argv()],
        "env": [{"name": "HOME", "value": SCRATCH_HOME}, {"name": "TMPDIR", "value": SCRATCH_HOME}],
        "terminationMessagePath": TERMINATION_LOG,
        # The verdict file when the program wrote one; else the log's tail (a crash explains itself).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": no_privileges(read_only_root=True),
        "volumeMounts": [*mounts, {"name": "scratch", "mountPath": SCRATCH_HOME}],
    }
    resources = client_resources(spec.clients.cpu, spec.clients.memory)
    if resources:
        container["resources"] = resources
    return container


def _on_exit(action: str, container: Component, codes: list[int]) -> dict[str, Any]:
    """A podFailurePolicy rule: what the Job controller does when `container` exits with one of `codes`."""
    return {"action": action, "onExitCodes": {"containerName": str(container), "operator": "In", "values": codes}}


IGNORE_DISRUPTION = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
"""A pod evicted, preempted or drained off its node is no failure of its own: it spends no retry."""
STEP_RETRIES = 2
"""Retries of a crashed step pod: each step is safe to run again (release-lease is idempotent)."""


def step_failure_policy(container: Component) -> dict[str, Any]:
    """The one failure policy of every step Job: a disruption is free, a written verdict that did not pass fails
    it at once (running it again gives the same verdict), any other exit (a crash, EXIT_STEP_CRASHED) is retried
    STEP_RETRIES times. The first rule that matches decides: an evicted pod whose program exited 1 on its SIGTERM
    is still an eviction, never a verdict. release-lease writes no verdict, so for it every failure is a crash."""
    verdict = _on_exit("FailJob", container, [EXIT_FAILED_VERDICT])
    return {"backoffLimit": STEP_RETRIES, "podFailurePolicy": {"rules": [IGNORE_DISRUPTION, verdict]}}


RELEASE_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
"""A lease file removed: far below what spec.clients asks for the workers."""


@dataclass(frozen=True)
class StepJob:
    """What one step Job has of its own; the pod, its volumes and the failure policy are every step's."""

    name: Callable[[str], str]
    reads_run: bool = True
    """The run file and the model volume (the tokenizer) mounted: every step but release-lease, which only
    removes the lease file from the output."""
    output_writable: bool = True
    resources: Mapping[str, Any] | None = None
    """None: spec.clients' cpu and memory, as every CPU pod of the run."""


STEP_JOBS: dict[Component, StepJob] = {
    # Writes the dataset's pin into the output and takes its lease.
    Component.PREFLIGHT: StepJob(preflight_job_name),
    # The canary's records stay with the data, passed or failed.
    Component.CANARY: StepJob(canary_job_name),
    Component.VERIFY: StepJob(verify_job_name, output_writable=False),
    Component.EXPORT: StepJob(export_job_name),
    Component.RELEASE: StepJob(release_job_name, reads_run=False, resources=RELEASE_RESOURCES),
}
"""The step Jobs, one row each: where they differ. The dataset volume is mounted when the command names the
dataset; the verdict comes back as the container's termination message."""


def _step_job(
    run: RunRef,
    spec: DataGenRunSpec,
    image: str,
    component: Component,
    command: Command,
    annotations: dict[str, str] | None = None,
) -> Manifest:
    step = STEP_JOBS[component]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if step.reads_run:
        run_volume, run_mount = run_file_volume(run.name)
        model_volumes, model_mounts = model_volume(spec)  # at model.path: the tokenizer is where the spec says
        volumes += [run_volume, *model_volumes]
        mounts += [run_mount, *model_mounts]
    reads_dataset = getattr(command, "dataset", None) is not None
    data_volumes, data_mounts = dataset_and_output_volumes(
        spec, dataset=reads_dataset, output=True, output_writable=step.output_writable
    )
    container = _datagen_container(component, image, command, [*mounts, *data_mounts], spec)
    if step.resources is not None:
        container["resources"] = dict(step.resources)
    return _job(
        run,
        spec,
        step.name(run.name),
        component,
        container,
        [*volumes, *data_volumes],
        step_failure_policy(component),
        annotations=annotations,
    )


def preflight_job(run: RunRef, spec: DataGenRunSpec, image: str, data_generation: int) -> Manifest:
    """The inputs checked before the server is created (no GPU): dataset, tokenizer, an existing output's
    fingerprint and records. It writes one thing, the dataset's pin into the output (prompts/pin.py)."""
    command = PreflightCommand(
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        output=output_dir(spec),
        termination_log=TERMINATION_LOG,
        lease_holder=run.uid,
    )
    return _step_job(run, spec, image, Component.PREFLIGHT, command, {DATA_GENERATION: str(data_generation)})


def canary_job(run: RunRef, spec: DataGenRunSpec, image: str, urls: list[str], data_generation: int) -> Manifest:
    """The canary runs in a pod because it needs the tokenizer (model volume) and the dataset volume, which the
    operator does not mount."""
    command = CanaryCommand(
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        servers=tuple(urls),
        records=posixpath.join(output_dir(spec), CANARY_RECORDS),
        termination_log=TERMINATION_LOG,
        output=output_dir(spec),
        lease_holder=run.uid,
    )
    annotations = {DATA_GENERATION: str(data_generation), SERVER_URLS: ",".join(urls)}
    return _step_job(run, spec, image, Component.CANARY, command, annotations)


def workers_job(
    run: RunRef, spec: DataGenRunSpec, image: str, urls: list[str], *, suspend: bool, concurrency: int | None = None
) -> Manifest:
    """An Indexed Job, one index per shard. Outages and drains do not burn retries; bad input fails the index.
    `concurrency`: clients.concurrency auto's number, the canary's (the Job is never re-applied, so a resume
    whose Job is gone gets it again from the remembered canary verdict)."""
    run_volume, run_mount = run_file_volume(run.name)
    model_volumes, model_mounts = model_volume(spec)
    data_volumes, data_mounts = dataset_and_output_volumes(spec, dataset=True, output=True, output_writable=True)
    shards = spec.clients.shards
    # No shard index: each pod's is $JOB_COMPLETION_INDEX (an Indexed Job), the count is spec.clients.shards.
    command = WorkerCommand(
        run=RUN_FILE,
        output=output_dir(spec),
        dataset=dataset_file(spec),
        tokenizer=spec.model.tokenizer_dir,
        servers=tuple(urls),
        progress_configmap=shard_configmap_name(run.name, "$(JOB_COMPLETION_INDEX)"),
        log_format="json",
        termination_log=TERMINATION_LOG,
        lease_holder=run.uid,
        concurrency=concurrency if spec.clients.concurrency == AUTO_CONCURRENCY else None,
    )
    container = _datagen_container(Component.WORKER, image, command, [run_mount, *model_mounts, *data_mounts], spec)
    container["env"].append({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    job_spec = {
        "completionMode": "Indexed",
        "completions": shards,
        "parallelism": shards,
        "backoffLimitPerIndex": SHARD_RETRIES,
        "suspend": suspend,
        "podFailurePolicy": {
            "rules": [
                IGNORE_DISRUPTION,
                _on_exit("Ignore", Component.WORKER, list(FREE_EXITS)),
                _on_exit("FailIndex", Component.WORKER, sorted(PERMANENT_EXITS)),
            ]
        },
    }
    job = _job(
        run,
        spec,
        workers_job_name(run.name),
        Component.WORKER,
        container,
        [run_volume, *model_volumes, *data_volumes],
        job_spec,
        service_account=worker_account_name(run.name),
        annotations={SERVER_URLS: ",".join(urls)},
    )
    # SIGKILL only after the worker's drain and final fsync: a stopped worker ends on its own, files synced.
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = WORKER_GRACE_S
    return job


def verify_job(run: RunRef, spec: DataGenRunSpec, image: str) -> Manifest:
    """`datagen verify` over the whole output, read-only."""
    command = VerifyCommand(
        output=output_dir(spec),
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        dataset=dataset_file(spec),
        json=True,
        termination_log=TERMINATION_LOG,
    )
    return _step_job(run, spec, image, Component.VERIFY, command)


def export_job(run: RunRef, spec: DataGenRunSpec, image: str) -> Manifest:
    """`datagen export --formats` of the verified output into spec.export.path."""
    assert spec.export is not None
    # Whole conversations are read against the dataset's planned turns: the dataset only then.
    whole = whole_conversations_asked(spec.export.rows, spec.export.formats)
    command = ExportCommand(
        output=output_dir(spec),
        formats=tuple(spec.export.formats),
        out=export_dir(spec),
        run=RUN_FILE,
        tokenizer=spec.model.tokenizer_dir,
        termination_log=TERMINATION_LOG,
        max_length=spec.export.max_length,
        exclude_flags=tuple(spec.export.exclude_flags),
        rows=spec.export.rows,
        rerendered_spans=spec.export.rerendered_spans,
        dataset=dataset_file(spec) if whole else None,
    )
    return _step_job(run, spec, image, Component.EXPORT, command)


def release_job(run: RunRef, spec: DataGenRunSpec, image: str, taken_before: float | None) -> Manifest:
    """`datagen release-lease` on the output: a halted run's lease given back (k8s/children.py plans it
    once per halt)."""
    command = ReleaseLeaseCommand(output=output_dir(spec), lease_holder=run.uid, taken_before=taken_before)
    return _step_job(run, spec, image, Component.RELEASE, command)
