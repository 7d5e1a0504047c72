"""The one registry of a run's children (k8s/registry.py): every child the planner names has its kind, name,
component and builder there, and what is built is what the registry says."""

from __future__ import annotations

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.k8s import object_meta, server_manifests
from datagen_operator.k8s.children import Child
from datagen_operator.k8s.executor import SERVER_WORKLOADS
from datagen_operator.k8s.registry import JOBS, REGISTRY, WATCHED, BuildInputs, build, child_name
from tests.manifests import unit_spec

RUN = object_meta.RunRef("kimi", "ml", "u-1")
SPEC = parse_spec(unit_spec(**{"clients.shards": 3, "server.replicas": 2})).model_copy(
    update={"export": ExportSpec.model_validate({"formats": ["speculators"]})}
)


def test_every_child_the_planner_names_is_registered() -> None:
    assert set(REGISTRY) == set(Child)


@pytest.mark.parametrize("child", [c for c in Child if REGISTRY[c].build is not None])
def test_a_built_child_is_the_kind_name_and_component_the_registry_says(child: Child) -> None:
    entry = REGISTRY[child]
    inputs = BuildInputs(RUN, SPEC, "img:1", 1, ("http://kimi-server-0.ml:30000",), index=1, taken_before=5.0)
    manifest = build(child, inputs)
    assert manifest["kind"] == entry.kind
    assert manifest["metadata"]["name"] == child_name(child, RUN.name, 1)
    assert manifest["metadata"]["labels"][object_meta.COMPONENT_LABEL] == entry.component
    if entry.kind == "Job":
        pod_labels = manifest["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[object_meta.COMPONENT_LABEL] == entry.component, "a Job's pods are found by its component"
        assert type(pod_labels[object_meta.COMPONENT_LABEL]) is str, "plain strings: manifests are dumped as YAML too"


def test_the_served_workloads_are_the_registrys_kind_and_name() -> None:
    for nodes, child in ((1, Child.SERVER_STATEFULSET), (2, Child.SERVER_GROUP)):
        spec = parse_spec(unit_spec(**{"server.nodes": nodes, "server.tensorParallel": 8 * nodes}))
        workload = server_manifests.server_workload(RUN, spec, 1)
        assert (workload["kind"], workload["metadata"]["name"]) == (REGISTRY[child].kind, child_name(child, RUN.name))
        with pytest.raises(ValueError, match="not built by the executor"):
            build(child, BuildInputs(RUN, spec, "img:1", 1, ()))


def test_every_child_kind_but_the_group_is_watched() -> None:
    watched = {w.kind for w in WATCHED}
    assert {e.kind for e in REGISTRY.values()} - watched == {object_meta.LWS_KIND}
    assert len({w.index_id for w in WATCHED}) == len(WATCHED), "one kopf index per kind"


def test_the_finalizer_stops_every_job_and_both_server_workloads() -> None:
    assert set(JOBS) == {c for c, e in REGISTRY.items() if e.kind == "Job"}
    assert set(SERVER_WORKLOADS) == {c for c, e in REGISTRY.items() if e.build is None}
