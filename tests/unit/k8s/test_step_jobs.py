"""k8s.job_manifests STEP_JOBS: the step Jobs (preflight, canary, verify, export, release-lease) built from one table,
with one failure policy; a row says only where a step differs."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT
from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.api.paths import DATASET_MOUNT, OUTPUT_MOUNT
from datagen_operator.k8s import job_manifests, object_meta, pod_parts
from datagen_operator.k8s.children import Child
from datagen_operator.k8s.pod_paths import RUN_FILE_DIR
from datagen_operator.k8s.registry import REGISTRY, BuildInputs, build, child_name
from tests.manifests import unit_spec

RUN = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")
SPEC = parse_spec(unit_spec(**{"clients.cpu": "2", "clients.memory": "4Gi"})).model_copy(
    update={"export": ExportSpec.model_validate({"formats": ["trl"]})}
)
STEP_CHILDREN = [child for child, entry in REGISTRY.items() if entry.component in job_manifests.STEP_JOBS]


def built(child: Child) -> object_meta.Manifest:
    return build(child, BuildInputs(RUN, SPEC, "img:1", 1, ("http://a",), taken_before=5.0))


def container_of(job: object_meta.Manifest) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_every_step_job_is_a_row_of_the_table() -> None:
    assert {REGISTRY[child].component for child in STEP_CHILDREN} == set(job_manifests.STEP_JOBS)
    assert len(STEP_CHILDREN) == 5


@pytest.mark.parametrize("child", STEP_CHILDREN, ids=str)
def test_every_step_job_has_the_one_failure_policy(child: Child) -> None:
    job = built(child)
    component = REGISTRY[child].component
    assert job["metadata"]["name"] == child_name(child, RUN.name) == job_manifests.STEP_JOBS[component].name(RUN.name)
    assert container_of(job)["name"] == str(component)
    spec = job["spec"]
    assert {k: v for k, v in spec.items() if k != "template"} == job_manifests.step_failure_policy(component)
    assert spec["backoffLimit"] == job_manifests.STEP_RETRIES
    first, verdict = spec["podFailurePolicy"]["rules"]
    assert first == job_manifests.IGNORE_DISRUPTION  # first: an evicted pod that exited 1 on SIGTERM is no verdict
    assert verdict["action"] == "FailJob" and verdict["onExitCodes"]["values"] == [EXIT_FAILED_VERDICT]


@pytest.mark.parametrize("child", STEP_CHILDREN, ids=str)
def test_a_step_asks_for_the_clients_resources_unless_its_row_says_otherwise(child: Child) -> None:
    row = job_manifests.STEP_JOBS[REGISTRY[child].component]
    expected = row.resources or pod_parts.client_resources(SPEC.clients.cpu, SPEC.clients.memory)
    assert container_of(built(child))["resources"] == expected


def test_where_the_steps_differ() -> None:
    def mounts(child: Child) -> dict[str, bool]:
        return {v["mountPath"]: bool(v.get("readOnly")) for v in container_of(built(child))["volumeMounts"]}

    for child in (Child.PREFLIGHT, Child.CANARY, Child.EXPORT):
        assert mounts(child)[OUTPUT_MOUNT] is False, child  # writable: the pin, the canary's records, the export
    assert mounts(Child.VERIFY)[OUTPUT_MOUNT] is True
    assert all(DATASET_MOUNT in mounts(c) for c in (Child.PREFLIGHT, Child.CANARY, Child.VERIFY))
    assert DATASET_MOUNT not in mounts(Child.EXPORT)  # rows of turns: the dataset is not read
    release = mounts(Child.RELEASE)
    assert set(release) == {OUTPUT_MOUNT, pod_parts.SCRATCH_HOME} and RUN_FILE_DIR not in release
    assert container_of(built(Child.RELEASE))["resources"] == job_manifests.RELEASE_RESOURCES
