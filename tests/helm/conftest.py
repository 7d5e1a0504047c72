"""Everything under tests/helm needs the testbin's helm and kubectl (and most of it the control plane):
mark it `cluster`. Helpers render the chart with the pinned helm v4 and parse what it prints."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.processes import ControlPlaneError
from tests.harness.sim import SimServer, start_sim
from tests.harness.testbin import REPO_ROOT, ensure_testbin
from tests.helm.installed import RUN_API, Leftovers

_HERE = Path(__file__).parent
CHART = REPO_ROOT / "charts" / "datagen-operator"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.cluster)


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path

    def run(
        self, tool: str, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs helm or kubectl; a failure shows the command and what it printed."""
        binary = self.helm if tool == "helm" else self.kubectl
        # helm keeps caches and repositories under $HOME; tests must not read or write the user's.
        env = {**os.environ, "HELM_CACHE_HOME": "/tmp/datagen-helm-test/cache"}
        env |= {"HELM_CONFIG_HOME": "/tmp/datagen-helm-test/config", "HELM_DATA_HOME": "/tmp/datagen-helm-test/data"}
        result = subprocess.run([str(binary), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)
        if check and result.returncode != 0:
            pytest.fail(
                f"{tool} {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}", pytrace=False
            )
        return result

    def template(
        self, *args: str, values: Sequence[Path] = (), namespace: str = "datagen-system", release: str = "dg"
    ) -> list[dict[str, Any]]:
        """The documents `helm template` renders (CRDs excluded unless --include-crds is passed)."""
        files = [arg for path in values for arg in ("-f", str(path))]
        out = self.run("helm", "template", release, str(CHART), "--namespace", namespace, *files, *args).stdout
        return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def kubelet(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    """Runs the runs' CPU pods (the preflight) as local processes; kwok runs the GPU ones. The chart's operator
    pod is left Pending: the test runs the operator itself, as that pod would."""
    node = PodRunner(control_plane, tmp_path_factory.mktemp("kubelet"), only_label="datagen.dev/component").start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def tools() -> Tools:
    """helm and kubectl from hack/testbin (built or found by the harness, the versions it pins)."""
    try:
        directory = ensure_testbin()
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)
    found = Tools(helm=directory / "helm", kubectl=directory / "kubectl")
    for binary in (found.helm, found.kubectl):
        if not os.access(binary, os.X_OK):
            pytest.fail(f"{binary} is missing: run `make testbin`", pytrace=False)
    return found


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(documents, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}: {[d['kind'] for d in documents]}"
    return found[0]


@pytest.fixture
def leftovers(tools: Tools, control_plane: Cluster) -> Iterator[Leftovers]:
    found = Leftovers()
    yield found
    kubeconfig = str(control_plane.kubeconfig)
    for release, namespace in found.releases:
        tools.run("helm", "uninstall", release, "--kubeconfig", kubeconfig, "-n", namespace, "--ignore-not-found",
                  check=False)  # fmt: skip
    runs = control_plane.resource(RUN_API, "DataGenRun")
    for namespace in found.run_namespaces:
        for run in runs.get(namespace=namespace).items:
            if run.metadata.finalizers:  # nobody serves them any more
                runs.patch(
                    body={"metadata": {"finalizers": None}},
                    name=run.metadata.name,
                    namespace=namespace,
                    content_type="application/merge-patch+json",
                )
    for namespace in found.extra_namespaces:
        control_plane.resource("v1", "Namespace").delete(name=namespace)


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with start_sim("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2") as server:
        yield server
