"""The operator on the real control plane: kopf's KopfRunner in this process, logged in as its own
ServiceAccount bound to k8s/rbac.py's rules; a test kubelet for CPU pods; the simulator on loopback."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL
from datagen_operator.k8s.rbac import CLUSTER_RULES
from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.processes import wait_until

T = TypeVar("T")
GROUP, VERSION = API_GROUP, API_VERSION
PROMPTS = [
    {"id": f"p{i:03d}", "messages": [{"role": "user", "content": f"Question {i}: why is the sky blue, in {i} words?"}]}
    for i in range(24)
]


KIMI = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-answer-tokens", "40",
        "--sim-mean-reasoning-tokens", "60")  # fmt: skip
WORKER_IMAGE = "datagen-operator/datagen:test"
"""The operator's worker image in these tests (the test kubelet runs the pods' commands on this machine)."""
SLOW = ("--sim-speed", "gpu", "--sim-tokens-per-s", "40", "--sim-ttft-s", "0.05")
"""About 2.5 s per request: the run lasts long enough to crash a worker and restart the operator mid-run."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def kubelet(control_plane: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    node = PodRunner(control_plane, tmp_path_factory.mktemp("kubelet")).start()
    yield node
    node.stop()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return data


@dataclass
class Runs:
    """The test's view of DataGenRuns in one namespace (as the admin)."""

    cluster: Cluster
    namespace: str

    def __post_init__(self) -> None:
        api = self.cluster.api_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.apps = client.AppsV1Api(api)

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest)

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        conditions = (self.get(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    def wait(
        self, name: str, type_: str, status: str, reason: str | None = None, timeout: float = 90.0
    ) -> dict[str, Any]:
        return self.watching(name, type_, status, reason, timeout=timeout)

    def watching(
        self,
        name: str,
        type_: str,
        status: str,
        reason: str | None = None,
        *,
        timeout: float = 90.0,
        words: str = "",
        look: Callable[[], object] = lambda: None,
        details: Callable[[], str] = lambda: "",
    ) -> dict[str, Any]:
        """The run's condition `type_` once it has `status`, `reason` (any if None) and `words` in its message;
        `look()` is called on every poll (a test recording what it sees on the way), `details()` explains a
        timeout beside the run's conditions and the namespace's pods and Jobs."""

        def reached() -> dict[str, Any] | None:
            look()
            found = self.condition(name, type_)
            wanted = found and found["status"] == status and (reason is None or found["reason"] == reason)
            return found if wanted and words in found["message"] else None

        def explain() -> str:
            conditions = (self.get(name).get("status") or {}).get("conditions")
            return f"conditions {conditions}\n{details()}\n{self.describe()}"

        what = f"{name} {type_}={status} ({reason}) {words!r}"
        return wait_until(reached, timeout=timeout, describe=what, interval=0.3, details=explain)

    def describe(self) -> str:
        """Pods and Jobs of the namespace, for failure messages."""
        lines = []
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            conditions = [(c.type, c.status, c.reason, c.message) for c in pod.status.conditions or []]
            lines.append(f"pod {pod.metadata.name} node={pod.spec.node_name} phase={pod.status.phase} {conditions}")
        for job in self.batch.list_namespaced_job(self.namespace).items:
            lines.append(f"job {job.metadata.name} suspend={job.spec.suspend} status={job.status.to_dict()}")
        return "\n".join(lines)

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout: float = 60.0, details: Callable[[], str] = lambda: ""
    ) -> Any:
        def explain() -> str:
            return f"{details()}\n{self.describe()}"

        return wait_until(check, timeout=timeout, describe=what, interval=0.3, details=explain)

    def passes(self, name: str) -> float:
        """Passes the in-process operator finished over the run (its metric `datagen_run_passes_total`)."""
        from datagen_operator.k8s import metrics

        labels = {"namespace": self.namespace, "name": name}
        return metrics.REGISTRY.get_sample_value("datagen_run_passes_total", labels) or 0.0

    def during_passes(self, name: str, count: int, look: Callable[[], T], timeout: float = 60.0) -> list[T]:
        """`look()` every 0.3 s until the operator has made `count` whole passes over the run that began after this
        call (a pass under way now is not one of them): what a test waits on before it says that something did
        NOT happen, instead of a fixed sleep. Every look's result, in order (at least one)."""
        wanted = self.passes(name) + count + 1
        seen = [look()]

        def made() -> bool:
            seen.append(look())
            return self.passes(name) >= wanted

        wait_until(made, timeout=timeout, describe=f"{count} passes over {name}", interval=0.3)
        return seen

    def wait_passes(self, name: str, count: int = 3, timeout: float = 60.0) -> None:
        """Returns once the operator has made `count` whole passes over the run begun after this call."""
        self.during_passes(name, count, lambda: None, timeout)

    def pod_ip(self, name: str) -> str | None:
        try:
            return self.core.read_namespaced_pod(name, self.namespace).status.pod_ip
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def events(self, name: str) -> list[Any]:
        return self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}").items

    def job(self, name: str) -> Any | None:
        try:
            return self.batch.read_namespaced_job(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def kubectl_get_wide(self, log: Path) -> str:
        kubectl = shutil.which("kubectl") or str(Path(self.cluster.binary("kubectl")))  # type: ignore[attr-defined]
        out = subprocess.run(
            [kubectl, f"--kubeconfig={self.cluster.kubeconfig}", "-n", self.namespace, "get", "dgr", "-o", "wide"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        with log.open("a") as handle:
            handle.write(out + "\n")
        return out


@pytest.fixture
def runs(control_plane: Cluster, namespace: str) -> Runs:
    return Runs(control_plane, namespace)


@dataclass
class OperatorHandle:
    runner: Any

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.__exit__(None, None, None)
            self.runner = None


OperatorFactory = Callable[..., OperatorHandle]


def operator_account(control_plane: Cluster, namespace: str) -> tuple[Path, Callable[[], None]]:
    """The kubeconfig of ServiceAccount datagen-operator of `namespace`, bound to a ClusterRole with exactly
    k8s/rbac.py's rules, and what removes that role again."""
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client())
    role = f"datagen-operator-{namespace}"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [dict(r) for r in CLUSTER_RULES]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "datagen-operator", "namespace": namespace}],
        }
    )

    def unbind() -> None:
        for call in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            with contextlib.suppress(ApiException):
                call(role)

    return control_plane.kubeconfig_for_service_account(namespace, "datagen-operator"), unbind


def start_kopf(
    monkeypatch: pytest.MonkeyPatch,
    kubeconfig: Path,
    watched: str,
    server_urls: list[str],
    worker_image: str = WORKER_IMAGE,
    env: dict[str, str | None] | None = None,
) -> Any:
    """kopf's KopfRunner, entered: the operator in this process watching namespace `watched` as the kubeconfig's
    user, its servers at `server_urls`, with the tests' pace (a pass every second, progress written every 2 s);
    `env` sets more of its variables (None: the operator's default). Leave it with `.__exit__(None, None, None)`."""
    from kopf.testing import KopfRunner

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("DATAGEN_TEST_SERVER_URLS", ",".join(server_urls))
    monkeypatch.setenv("DATAGEN_RESYNC_SECONDS", "1")
    monkeypatch.setenv("DATAGEN_PROGRESS_WRITE_SECONDS", "2")
    monkeypatch.setenv("DATAGEN_MESSAGE_WRITE_SECONDS", "2")
    monkeypatch.setenv("DATAGEN_WORKER_IMAGE", worker_image)
    for key, value in (env or {}).items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    runner = KopfRunner(
        ["run", "--standalone", "--namespace", watched, "-m", "datagen_operator.k8s.handlers"], timeout=60
    )
    runner.__enter__()
    return runner


@pytest.fixture
def operator(control_plane: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[OperatorFactory]:
    """`(server_urls, worker_image=...) -> handle`: the operator in-process as ServiceAccount datagen-operator of
    the test's namespace, bound to a ClusterRole with exactly k8s/rbac.py's rules. Call again after `.stop()` to
    restart (with another worker image: an operator upgrade)."""
    kubeconfig, unbind = operator_account(control_plane, namespace)
    handles: list[OperatorHandle] = []

    def start(
        server_urls: list[str], worker_image: str = WORKER_IMAGE, env: dict[str, str | None] | None = None
    ) -> OperatorHandle:
        handle = OperatorHandle(start_kopf(monkeypatch, kubeconfig, namespace, server_urls, worker_image, env))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()
    unbind()


STRICT = {"maxTruncationRate": 0.0, "minReasoningRate": 0.0}
"""spec.checks that halt a run on one truncated record (patched onto a running run)."""
LONG_ANSWERS = ("--sim-mean-answer-tokens", "80", "--sim-mean-reasoning-tokens", "8")
"""Answers longer than max_new_tokens (64): truncated records, which a strict maxTruncationRate halts on."""
TRUNCATING_LENIENTLY = {
    "generation.sampling": {"max_new_tokens": 64},
    "checks.maxTruncationRate": 1.0,
    "checks.minReasoningRate": 0.0,
}
"""Dotted spec changes: answers cut at 64 tokens (with LONG_ANSWERS, truncated) that no rolling check halts on."""


def many_prompts(data_dir: Path, count: int = 120, question: str = "why?") -> None:
    """Enough prompts that a run is still generating when the strict checks come in (prompts.jsonl)."""
    lines = [
        {"id": f"q{i:04d}", "messages": [{"role": "user", "content": f"Question {i}: {question}"}]}
        for i in range(count)
    ]
    (data_dir / "prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def new_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(2)}"


def dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False)
