"""pytest fixtures for tests that need a real Kubernetes API server (any folder).

Registered for the whole suite by `pytest_plugins = ["tests.harness.cluster_fixtures"]` in
tests/conftest.py. The control plane starts once per session, and only if a selected test asks for it.

Environment:
  DATAGEN_TEST_KUBECONFIG   use this existing cluster instead of starting one (docs/testing.md)
  DATAGEN_TEST_KWOK         with an existing cluster: "local" (default) runs kwok here,
                            "in-cluster" means kwok already runs there
  DATAGEN_TEST_GPU_NODES    how many fake 8-GPU nodes (default 2)
  DATAGEN_TEST_CRD_DIR      install the CRDs (*.yaml) from this folder instead of crds/
  DATAGEN_TESTBIN_DIR       a prebuilt testbin folder instead of hack/testbin/build.sh's cache
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.harness.controlplane import CRD_DIR, Cluster, ClusterSettings, ExistingCluster, LocalControlPlane
from tests.harness.kueue import KUEUE_ALL_JOBS_LABEL, KUEUE_NAMESPACE_LABEL
from tests.harness.processes import ControlPlaneError, ManagedProcess, wait_until
from tests.harness.testbin import BUILD_LOG, ensure_testbin

T = TypeVar("T")
CONTROL_PLANE_FIXTURE = "control_plane"
_testbin_problem = pytest.StashKey[ControlPlaneError | None]()
_active_cluster: Cluster | None = None  # the running one, for the failure report
_last_started_cluster: Cluster | None = None  # for the start-up time in the terminal summary
_start_failure_reported = False


def _external_kubeconfig() -> Path | None:
    value = os.environ.get("DATAGEN_TEST_KUBECONFIG")
    return Path(value).expanduser() if value else None


def _testbin_needed() -> bool:
    # An existing cluster needs only kwok from the testbin, and only when kwok runs here.
    if _external_kubeconfig() is None:
        return True
    return os.environ.get("DATAGEN_TEST_KWOK", "local") == "local" and shutil.which("kwok") is None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Any test that needs the control plane, in whatever folder, is a `cluster` test for `-m`.
    for item in items:
        if CONTROL_PLANE_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def pytest_collection_finish(session: pytest.Session) -> None:
    # Build a cold testbin here rather than inside the fixture: a cold build takes far longer than
    # the per-test timeout, which covers fixture set-up.
    if not _testbin_needed() or not any(
        CONTROL_PLANE_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            "checking the test control plane binaries (hack/testbin/build.sh; a cold build takes ~15 min, "
            f"progress in {BUILD_LOG}) ..."
        )
    try:
        ensure_testbin()
        session.config.stash[_testbin_problem] = None
    except ControlPlaneError as problem:
        session.config.stash[_testbin_problem] = problem


def _call_or_fail(action: Callable[[], T]) -> T:
    """Runs `action`; a ControlPlaneError fails the test with its message alone, no traceback."""
    try:
        return action()
    except ControlPlaneError as error:
        message = str(error)
    pytest.fail(message, pytrace=False)  # outside `except`: pytest would print the chained traceback


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The running cluster: `.kubeconfig` (admin), `.gpu_node_names`, `.api_client()`,
    `.kubeconfig_for_service_account(ns, name)`, `.start_subject(...)`, `.logs_dir`."""
    global _active_cluster, _last_started_cluster
    settings = ClusterSettings(
        gpu_nodes=int(os.environ.get("DATAGEN_TEST_GPU_NODES", "2")),
        crd_dir=Path(os.environ.get("DATAGEN_TEST_CRD_DIR", str(CRD_DIR))),
    )
    workdir = tmp_path_factory.mktemp("controlplane")  # kept by pytest (last 3 runs) for the logs
    external = _external_kubeconfig()
    cluster: Cluster
    if external is not None:
        cluster = ExistingCluster(
            workdir,
            settings,
            admin_kubeconfig=external,
            kwok_mode=os.environ.get("DATAGEN_TEST_KWOK", "local"),
        )
        settings.node_name_prefix = "datagen-test-gpu"  # never collide with the cluster's own nodes
    else:
        problem = request.config.stash.get(_testbin_problem, None)
        if problem is not None:
            pytest.fail(str(problem), pytrace=False)
        cluster = LocalControlPlane(workdir, settings, testbin=_call_or_fail(ensure_testbin))
    _active_cluster = cluster
    _call_or_fail(cluster.start)
    _last_started_cluster = cluster
    try:
        yield cluster
    finally:
        cluster.stop()
        _active_cluster = None


@pytest.fixture(scope="session")
def lws_controller(control_plane: Cluster) -> Cluster:
    """The control plane with the LeaderWorkerSet controller serving it (CRD Established, webhooks
    admitting): started on first use locally; against an existing cluster, LWS must be installed there."""
    _call_or_fail(control_plane.ensure_lws)
    return control_plane


@pytest.fixture(scope="session")
def kueue_controller(control_plane: Cluster) -> Cluster:
    """The control plane with Kueue serving it (CRDs Established, webhooks admitting) in the namespaces
    labelled `KUEUE_NAMESPACE_LABEL` only: started on first use locally; against an existing cluster,
    Kueue must be installed there."""
    _call_or_fail(control_plane.ensure_kueue)
    return control_plane


@pytest.fixture
def kueue_namespace(kueue_controller: Cluster, namespace: str) -> str:
    """The test's namespace, labelled so that Kueue manages its workloads."""
    key, value = KUEUE_NAMESPACE_LABEL
    kueue_controller.resource("v1", "Namespace").patch(
        name=namespace, body={"metadata": {"labels": {key: value}}}, content_type="application/merge-patch+json"
    )
    return namespace


@pytest.fixture
def kueue_all_jobs_namespace(kueue_namespace: str, kueue_controller: Cluster) -> str:
    """The test's namespace, where Kueue manages every Job, with a queue label or without one (and every pod,
    StatefulSet and LeaderWorkerSet without one), as a cluster whose Kueue has `manageJobsWithoutQueueName: true`
    over all its namespaces. A Job there that names no LocalQueue runs only once a LocalQueue `default` exists."""
    key, value = KUEUE_ALL_JOBS_LABEL
    kueue_controller.resource("v1", "Namespace").patch(
        name=kueue_namespace,
        body={"metadata": {"labels": {key: value}}},
        content_type="application/merge-patch+json",
    )
    return kueue_namespace


@pytest.fixture(scope="session")
def kubeconfig(control_plane: Cluster) -> Path:
    """Path of the admin kubeconfig (user admin in system:masters)."""
    return control_plane.kubeconfig


@pytest.fixture(scope="session")
def kube_api(control_plane: Cluster) -> Any:
    """A `kubernetes` (sync) ApiClient for the admin."""
    return control_plane.api_client()


def _namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"t-{stem}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(request: pytest.FixtureRequest, control_plane: Cluster) -> Iterator[str]:
    """A fresh namespace for one test, with its `default` ServiceAccount in place; deleted afterwards."""
    namespaces = control_plane.resource("v1", "Namespace")
    service_accounts = control_plane.resource("v1", "ServiceAccount")
    name = _namespace_name(request.node.name)
    namespaces.create(body={"metadata": {"name": name, "labels": {"datagen.dev/test": "true"}}})
    # Pods are refused until the serviceaccount controller has made `default`.
    wait_until(
        lambda: service_accounts.get(namespace=name, field_selector="metadata.name=default").items,
        timeout=30,
        describe=f"ServiceAccount default in {name}",
    )
    yield name
    namespaces.delete(name=name)  # the namespace controller removes what is inside


ServiceAccountKubeconfig = Callable[..., Path]


@pytest.fixture
def service_account_kubeconfig(control_plane: Cluster, namespace: str) -> ServiceAccountKubeconfig:
    """`(name, namespace=<the test's>) -> Path`: a kubeconfig holding a TokenRequest token of that
    ServiceAccount (created if missing), so its RBAC applies and nothing more."""

    def make(name: str, namespace: str = namespace) -> Path:
        return control_plane.kubeconfig_for_service_account(namespace, name)

    return make


SubjectRunner = Callable[..., ManagedProcess]


@pytest.fixture
def run_as_service_account(control_plane: Cluster, namespace: str) -> Iterator[SubjectRunner]:
    """`(name, argv, service_account, namespace=<the test's>, env=None) -> ManagedProcess`: starts a
    subject (the operator, a worker) with KUBECONFIG set to the ServiceAccount's; stopped after the test."""
    started: list[ManagedProcess] = []

    def run(
        name: str,
        argv: Sequence[str],
        service_account: str,
        namespace: str = namespace,
        env: dict[str, str] | None = None,
    ) -> ManagedProcess:
        subject = control_plane.start_subject(name, argv, namespace=namespace, service_account=service_account, env=env)
        started.append(subject)
        return subject

    yield run
    for subject in started:
        subject.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    global _start_failure_reported
    report: pytest.TestReport = yield
    if report.failed and _active_cluster is not None and CONTROL_PLANE_FIXTURE in getattr(item, "fixturenames", ()):
        # A failed start errors every test that follows; show the tails once, then only the folder.
        if _last_started_cluster is None and _start_failure_reported:
            report.sections.append(("control plane logs", str(_active_cluster.logs_dir)))
        else:
            report.sections.append(("control plane logs", _active_cluster.failure_report()))
            _start_failure_reported = _last_started_cluster is None
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    cluster = _last_started_cluster
    if cluster is not None and cluster.startup_seconds is not None:
        kind = "existing cluster" if isinstance(cluster, ExistingCluster) else "local control plane"
        terminalreporter.write_line(
            f"{kind}: ready (GPU nodes Ready, CRDs Established) {cluster.startup_seconds:.1f} s after "
            f"the fixture started; logs in {cluster.logs_dir}"
        )
