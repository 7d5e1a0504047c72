"""Upgrades and uninstalls the way docs/install.md says to do them, with the real helm and API server.

- The CRD upgrade. Helm installs `crds/` once and never upgrades it, so a new CRD is applied with kubectl.
  Helm 4 installs it by server-side apply as field manager `helm`; a plain `kubectl apply --server-side` of
  the next version then conflicts on every field whose value changed. The documented command passes
  `--force-conflicts`, taking those fields over; `helm upgrade` afterwards leaves the CRD alone.
- The uninstall. Runs keep the operator's finalizer; with the operator gone, deleting their namespace hangs
  until `datagen release-finalizers` removes it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from datagen_operator.api.spec import API_GROUP_VERSION, API_VERSION
from tests.harness.cluster_fixtures import SubjectRunner
from tests.harness.controlplane import Cluster
from tests.harness.processes import free_port, wait_until
from tests.harness.sim import SimServer
from tests.harness.testbin import REPO_ROOT
from tests.helm.conftest import CHART, Tools
from tests.helm.installed import Leftovers, example_run, start_local_operator

CURRENT_CRD = REPO_ROOT / "crds" / "datagenrun.yaml"


def server_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["server"]["properties"]


def crd_in_group(group: str, *, previous: bool) -> dict[str, Any]:
    """The generated CRD under a group of this test's own (the session's cluster serves the real one to other
    tests). `previous`: as an older release shipped it, without server.runtimeClassName and server.external and
    with a lower gpus limit: fields added and a value changed, what a real upgrade brings."""
    crd = yaml.safe_load(CURRENT_CRD.read_text())
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    crd["spec"]["group"] = group
    if previous:
        server = server_schema(crd)
        del server["runtimeClassName"]
        server["gpus"]["maximum"] = 32
        # Nor server.external (a later field), whose rules name the server's other fields, runtimeClassName too.
        del server["external"]
        (version,) = crd["spec"]["versions"]
        server_object = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["server"]
        server_object["x-kubernetes-validations"] = [
            rule for rule in server_object.get("x-kubernetes-validations", []) if "external" not in rule["rule"]
        ]
    return crd


def chart_with_crd(tmp: Path, name: str, crd: dict[str, Any]) -> Path:
    """A copy of the chart whose crds/datagenrun.yaml is `crd` (the rest as shipped)."""
    chart = tmp / name / "datagen-operator"
    shutil.copytree(CHART, chart)  # follows the crds/ link: a plain file in the copy
    (chart / "crds" / "datagenrun.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def run_in_group(group: str, name: str, **server: Any) -> dict[str, Any]:
    run = yaml.safe_load((REPO_ROOT / "examples" / "kimi-k2.5.yaml").read_text())
    run["apiVersion"] = f"{group}/{API_VERSION}"
    run["metadata"]["name"] = name
    run["spec"]["server"].update(server)
    return run


def test_crd_upgrade_by_the_documented_command_with_helm_in_the_loop(
    tools: Tools, control_plane: Cluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = f"--kubeconfig={control_plane.kubeconfig}"
    group = f"u{secrets.token_hex(3)}.datagen.dev"
    previous = chart_with_crd(tmp_path, "previous", crd_in_group(group, previous=True))
    current = chart_with_crd(tmp_path, "current", crd_in_group(group, previous=False))
    crd_name = f"datagenruns.{group}"
    release = f"up-{secrets.token_hex(2)}"
    helm = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    values = ["--set", f"probes.port={free_port()}", "--set", f"metrics.operator.port={free_port()}"]
    crds = control_plane.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")

    def create(run: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return tools.run("kubectl", kubeconfig, "-n", namespace, "create", "--validate=strict", "-f", "-",
                         stdin=yaml.safe_dump(run), check=False)  # fmt: skip

    try:
        tools.run("helm", "install", release, str(previous), *helm, *values)
        control_plane.wait_for_crd(crd_name)
        managers = {f.manager for f in crds.get(name=crd_name).metadata.managedFields}
        assert "helm" in managers, managers
        old_field = create(run_in_group(group, "new-field", runtimeClassName="nvidia"))
        assert old_field.returncode != 0 and "runtimeClassName" in old_field.stderr, old_field.stderr
        assert create(run_in_group(group, "kept")).returncode == 0  # a run made under the old CRD

        # The trap: helm upgrade does not touch crds/, and a plain server-side apply conflicts with helm.
        tools.run("helm", "upgrade", release, str(current), *helm, "--reuse-values")
        assert "runtimeClassName" not in server_schema(crds.get(name=crd_name).to_dict())
        new_crds = tools.run("helm", "show", "crds", str(current)).stdout
        plain = tools.run("kubectl", kubeconfig, "apply", "--server-side", "-f", "-", stdin=new_crds, check=False)
        assert plain.returncode != 0 and "conflict" in plain.stderr.lower() and '"helm"' in plain.stderr, plain

        # The documented command (docs/install.md, "Upgrade").
        tools.run("kubectl", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=new_crds)
        wait_until(
            lambda: "runtimeClassName" in server_schema(crds.get(name=crd_name).to_dict()),
            timeout=30,
            describe="the new CRD served",
        )
        schema = server_schema(crds.get(name=crd_name).to_dict())
        assert schema["gpus"]["maximum"] == 64

        def accepted() -> bool:  # the API server's schema cache follows the CRD within a moment
            return create(run_in_group(group, "new-field", runtimeClassName="nvidia", gpus=48)).returncode == 0

        wait_until(accepted, timeout=30, describe="a run using the new field accepted")
        runs = control_plane.resource(f"{group}/{API_VERSION}", "DataGenRun")
        assert runs.get(name="kept", namespace=namespace).spec.server.gpus == 8  # old runs are still served

        # Later chart upgrades leave the CRD as applied; the next CRD upgrade is the same command again.
        tools.run("helm", "upgrade", release, str(current), *helm, "--reuse-values", "--set", "logLevel=debug")
        assert "runtimeClassName" in server_schema(crds.get(name=crd_name).to_dict())
        tools.run("kubectl", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=new_crds)
    finally:
        tools.run("helm", "uninstall", release, *helm, "--ignore-not-found", check=False)
        tools.run("kubectl", kubeconfig, "delete", "crd", crd_name, "--ignore-not-found", "--wait=false", check=False)


def test_after_helm_uninstall_release_finalizers_lets_the_namespace_go(
    tools: Tools,
    control_plane: Cluster,
    namespace: str,
    run_as_service_account: SubjectRunner,
    sim: SimServer,
    tmp_path: Path,
    leftovers: Leftovers,
) -> None:
    namespaces = control_plane.resource("v1", "Namespace")
    runs_namespace = f"{namespace}-runs"
    namespaces.create(body={"metadata": {"name": runs_namespace, "labels": {"datagen.dev/test": "true"}}})
    leftovers.extra_namespaces.append(runs_namespace)
    release, probe_port = f"fin-{secrets.token_hex(2)}", free_port()
    helm = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    leftovers.releases.append((release, namespace))
    leftovers.run_namespaces.append(runs_namespace)
    tools.run("helm", "install", release, str(CHART), *helm, "--set", f"probes.port={probe_port}",
              "--set", f"metrics.operator.port={free_port()}", "--set", "reconcile.resyncSeconds=2")  # fmt: skip
    deployment = control_plane.resource("apps/v1", "Deployment").get(
        name=f"{release}-datagen-operator", namespace=namespace
    )
    operator = start_local_operator(run_as_service_account, deployment.to_dict(), sim, probe_port, namespace)
    runs = control_plane.resource(API_GROUP_VERSION, "DataGenRun")
    data, models = tmp_path / "data", tmp_path / "models"
    data.mkdir(), models.mkdir()
    run = example_run(runs_namespace, data, models)
    name = run["metadata"]["name"]
    runs.create(body=run, namespace=runs_namespace)

    def finalizers() -> list[str]:
        return list(runs.get(name=name, namespace=runs_namespace).metadata.finalizers or [])

    wait_until(lambda: "datagen.dev/finalizer" in finalizers(), timeout=60, describe="the operator's finalizer",
               watched=[operator])  # fmt: skip

    tools.run("helm", "uninstall", release, *helm, "--wait", "--timeout", "60s")
    operator.stop()
    namespaces.delete(name=runs_namespace)
    wait_until(
        lambda: runs.get(name=name, namespace=runs_namespace).metadata.deletionTimestamp,
        timeout=60,
        describe="the namespace controller deleting the run",
    )

    def stuck_on_our_finalizer() -> bool:
        """The namespace controller has tried to empty the namespace and reports what holds it: our finalizer."""
        conditions = namespaces.get(name=runs_namespace).status.conditions or []
        return any(
            c.type == "NamespaceFinalizersRemaining"
            and c.status == "True"
            and "datagen.dev/finalizer" in (c.message or "")
            for c in conditions
        )

    # The trap: nobody runs the finalizer, so the run and its namespace stay.
    wait_until(stuck_on_our_finalizer, timeout=60, describe="the namespace controller held by the run's finalizer")
    assert namespaces.get(name=runs_namespace).status.phase == "Terminating"
    assert finalizers() == ["datagen.dev/finalizer"]

    released = subprocess.run(
        [str(Path(sys.executable).with_name("datagen")), "release-finalizers", "--namespace", runs_namespace],
        env={**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert released.returncode == 0, released.stderr
    assert released.stdout.split() == ["released", f"{runs_namespace}/{name}"]

    def namespace_gone() -> bool:
        return not namespaces.get(field_selector=f"metadata.name={runs_namespace}").items

    wait_until(namespace_gone, timeout=90, describe=f"namespace {runs_namespace} deleted")
    leftovers.extra_namespaces.remove(runs_namespace)
    leftovers.run_namespaces.remove(runs_namespace)
    assert (data / run["spec"]["dataset"]["path"]).is_file()  # the run's volume is never touched
