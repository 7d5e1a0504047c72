"""Children the operator owns whole (Services, the workers' RBAC) are watched and applied server-side: one deleted
or edited by hand is put back by the running operator, counted in its applies; a steady run sends none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from datagen_operator.k8s.kube import FIELD_MANAGER, Kube
from tests.harness.processes import wait_until
from tests.manifests import cluster_run
from tests.operator.conftest import OperatorFactory, Runs, new_name


@pytest.fixture
def applies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """('Kind/name', uid of the object it left) of every server-side apply the in-process operator sends."""
    sent: list[tuple[str, str]] = []
    original = Kube.apply

    async def recording(self: Kube, manifest: Any) -> Any:
        applied = await original(self, manifest)
        sent.append((f"{manifest['kind']}/{manifest['metadata']['name']}", applied["metadata"]["uid"]))
        return applied

    monkeypatch.setattr(Kube, "apply", recording)
    return sent


def creations(applies: list[tuple[str, str]], key: str) -> int:
    """Objects an apply brought into being for `key` (an apply over a cache that lags may repeat one: same uid)."""
    return len({uid for applied, uid in applies if applied == key})


def named(items: list[Any], name: str) -> Any:
    return next((item for item in items if item.metadata.name == name), None)


def settle(runs: Runs, name: str, applies: list[tuple[str, str]], quiet_passes: int = 3) -> None:
    """Wait until the operator made `quiet_passes` passes over the run in a row that sent no apply."""

    def quiet() -> bool:
        seen = len(applies)
        runs.wait_passes(name, quiet_passes)
        return len(applies) == seen

    wait_until(quiet, timeout=60, describe="passes sending no apply", interval=0, details=lambda: f"{applies[-5:]}")


def test_a_deleted_or_edited_child_comes_back_without_a_restart(
    runs: Runs, operator: OperatorFactory, data_dir: Path, standin_tokenizer: Path, applies: list[tuple[str, str]]
) -> None:
    name = new_name("children")
    operator(["http://127.0.0.1:9"])  # no server answers: the run stays before its server; its children exist
    runs.create(cluster_run(name, data_dir, standin_tokenizer))
    rbac = client.RbacAuthorizationV1Api(runs.cluster.api_client())
    service, binding = f"{name}-server-0", f"{name}-worker"
    services = lambda: runs.core.list_namespaced_service(runs.namespace).items  # noqa: E731
    bindings = lambda: rbac.list_namespaced_role_binding(runs.namespace).items  # noqa: E731
    runs.wait_for("the replica Service", lambda: named(services(), service))
    runs.wait_for("the RoleBinding", lambda: named(bindings(), binding))
    settle(runs, name, applies)
    assert creations(applies, f"Service/{service}") == creations(applies, f"RoleBinding/{binding}") == 1, applies
    built = runs.core.read_namespaced_service(service, runs.namespace)
    assert any(f.manager == FIELD_MANAGER and f.operation == "Apply" for f in built.metadata.managed_fields)

    # Deleted by hand: back within seconds, each as one new object.
    runs.core.delete_namespaced_service(service, runs.namespace)
    rbac.delete_namespaced_role_binding(binding, runs.namespace)
    again = runs.wait_for("the Service back", lambda: named(services(), service), timeout=30)
    assert again.metadata.uid != built.metadata.uid
    runs.wait_for("the RoleBinding back", lambda: named(bindings(), binding), timeout=30)
    settle(runs, name, applies)
    assert creations(applies, f"Service/{service}") == creations(applies, f"RoleBinding/{binding}") == 2, applies

    # Edited by hand (a port's target, a label): the operator's fields are taken back, nothing else moves.
    port = again.spec.ports[0]
    runs.core.patch_namespaced_service(
        service,
        runs.namespace,
        {"metadata": {"labels": {"app.kubernetes.io/component": "edited"}}, "spec": {"ports": [
            {"name": port.name, "port": port.port, "targetPort": 8080}
        ]}},
    )  # fmt: skip
    runs.wait_for(
        "the edit undone",
        lambda: (
            (s := runs.core.read_namespaced_service(service, runs.namespace)).spec.ports[0].target_port == "http"
            and s.metadata.labels["app.kubernetes.io/component"] == "server"
        ),
        timeout=30,
    )
    restored = runs.core.read_namespaced_service(service, runs.namespace)
    assert [(p.name, p.port, p.target_port) for p in restored.spec.ports] == [(port.name, port.port, "http")]
    assert restored.metadata.uid == again.metadata.uid, "repaired in place, not recreated"
    settle(runs, name, applies)
    assert creations(applies, f"Service/{service}") == 2, applies

    # A steady run sends no apply at all, however many passes it makes.
    before = len(applies)
    runs.wait_passes(name, 4)
    assert len(applies) == before, applies[before:]
