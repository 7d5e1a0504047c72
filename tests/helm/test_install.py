"""The chart on the real control plane, the way a user runs it: the API server accepts what it renders
(server-side dry run), `helm install`, the operator started exactly as the installed Deployment says
(command, args, env) under the chart's ServiceAccount and RBAC, an example run reconciled to ServerReady
against the simulator, `helm upgrade`, `helm uninstall` leaving no operator object and keeping the runs
and their output.

No image can run here (kwok fakes the nodes), so the operator runs as a local process with the rendered
Deployment's command; the simulator on loopback answers for the server pod through the operator's
test-only endpoint override (DATAGEN_TEST_SERVER_URLS, k8s/settings.py), which the chart never sets.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

from tests.harness.cluster_fixtures import SubjectRunner
from tests.harness.controlplane import Cluster, condition_status
from tests.harness.kubelet import PodRunner
from tests.harness.processes import ManagedProcess, free_port, wait_until
from tests.harness.sim import SimServer
from tests.helm.conftest import CHART, CI_VALUES, Tools
from tests.helm.installed import RUN_API, Leftovers, example_run, refused_calls, start_local_operator
from tests.manifests import changed

PEERING_CRDS = CHART / "crds" / "kopf-peering.yaml"
# PodMonitor needs prometheus-operator's CRD, which this cluster does not have; the render tests check it.
NOT_IN_THIS_CLUSTER = {"PodMonitor", "ServiceMonitor"}  # prometheus-operator's kinds: no such CRDs here


def documents_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_api_server_accepts_the_rendered_chart(tools: Tools, control_plane: Cluster, namespace: str) -> None:
    kubeconfig = f"--kubeconfig={control_plane.kubeconfig}"
    # The CRDs first (the peering objects need their kind), as helm does: kopf's for real, ours as a dry run.
    tools.run("kubectl", kubeconfig, "apply", "--server-side", "-f", str(PEERING_CRDS))
    crds = tools.run("helm", "show", "crds", str(CHART)).stdout
    tools.run("kubectl", kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=crds)
    for values in (None, *CI_VALUES):
        args = ["template", f"dry-{secrets.token_hex(2)}", str(CHART), "--namespace", namespace]
        args += ["--set", f"watch.namespaces={{{namespace}}}"] + (["-f", str(values)] if values else [])
        rendered = [d for d in documents_of(tools.run("helm", *args).stdout) if d["kind"] not in NOT_IN_THIS_CLUSTER]
        result = tools.run(
            "kubectl", kubeconfig, "apply", "--dry-run=server", "-n", namespace, "-f", "-",
            stdin=yaml.safe_dump_all(rendered),
        )  # fmt: skip
        kinds = {line.split("/")[0] for line in result.stdout.splitlines()}
        assert {"deployment.apps", "serviceaccount"} <= kinds, result.stdout


def test_install_reconcile_upgrade_uninstall(
    tools: Tools,
    control_plane: Cluster,
    namespace: str,
    run_as_service_account: SubjectRunner,
    sim: SimServer,
    kubelet: PodRunner,
    tmp_path: Path,
    leftovers: Leftovers,
) -> None:
    kubeconfig = f"--kubeconfig={control_plane.kubeconfig}"
    release = f"dg-{secrets.token_hex(2)}"
    helm = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    deployments = control_plane.resource("apps/v1", "Deployment")
    runs = control_plane.resource(RUN_API, "DataGenRun")
    probe_port = free_port()  # the chart's probe port, free on this machine for the local operator
    leftovers.releases.append((release, namespace))
    leftovers.run_namespaces.append(namespace)

    # --- install: non-default probe port and a short resync, so the test is quick --------------------
    tools.run("helm", "install", release, str(CHART), *helm, "--set", f"probes.port={probe_port}",
              "--set", f"metrics.operator.port={free_port()}", "--set", "reconcile.resyncSeconds=2")  # fmt: skip
    status = yaml.safe_load(tools.run("helm", "status", release, *helm, "-o", "yaml").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    crds = control_plane.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    for crd in ("datagenruns.datagen.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        assert condition_status(crds.get(name=crd).to_dict(), "Established") == "True"
    deployment = deployments.get(name=f"{release}-datagen-operator", namespace=namespace).to_dict()

    # --- the operator, as the Deployment runs it, as the chart's ServiceAccount ------------------------
    def start_operator(deployment: dict[str, Any]) -> ManagedProcess:
        return start_local_operator(run_as_service_account, deployment, sim, probe_port, namespace)

    operator = start_operator(deployment)
    data, models = tmp_path / "data", tmp_path / "models"
    data.mkdir(), models.mkdir()
    statefulsets = control_plane.resource("apps/v1", "StatefulSet")

    def create_run(name: str) -> tuple[str, Path]:
        run = changed(
            example_run(namespace, data, models), {"metadata.name": name, "spec.output.path": f"eagle3/{name}"}
        )
        runs.create(body=run, namespace=namespace)
        return name, data / "eagle3" / name

    def server_ready(name: str) -> bool:
        return condition_status(runs.get(name=name, namespace=namespace).to_dict(), "ServerReady") == "True"

    def wait_ready(name: str, process: ManagedProcess) -> None:
        wait_until(lambda: server_ready(name), timeout=60, describe=f"{name} ServerReady=True", watched=[process])

    first, first_output = create_run("kimi-k25-b1")
    wait_ready(first, operator)
    # What the run's workers write lands in its output folder (the preflight made it, to pin the dataset);
    # it must outlive the run and the operator.
    first_output.mkdir(parents=True, exist_ok=True)
    (first_output / "manifest.json").write_text("{}")

    # --- upgrade: new values reach the Deployment; the upgraded operator serves deletes and new runs --
    notes = tools.run(
        "helm", "upgrade", release, str(CHART), *helm, "--reuse-values", "--set", "logLevel=debug",
        "--set", "image.tag=v9.9.9-test",
    ).stdout  # fmt: skip
    # NOTES name what runs now: the upgrade, its revision and the operator's image, not only the chart.
    assert f"Release {release} in namespace {namespace} is upgraded (revision 2)" in notes, notes
    upgraded = deployments.get(name=deployment["metadata"]["name"], namespace=namespace).to_dict()
    assert "--verbose" in upgraded["spec"]["template"]["spec"]["containers"][0]["args"]
    image = upgraded["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith(":v9.9.9-test") and f"The operator runs image {image};" in notes, notes
    assert yaml.safe_load(tools.run("helm", "status", release, *helm, "-o", "yaml").stdout)["version"] == 2
    operator.stop()  # the Deployment's Recreate strategy: the old pod goes before the new one starts
    operator = start_operator(upgraded)
    runs.delete(name=first, namespace=namespace)  # its finalizer is the upgraded operator's to run

    def gone(name: str) -> bool:
        return not runs.get(namespace=namespace, field_selector=f"metadata.name={name}").items

    wait_until(lambda: gone(first), timeout=60, describe=f"{first} deleted by the operator", watched=[operator])
    assert (first_output / "manifest.json").read_text() == "{}"  # deleting a run keeps its data
    second, second_output = create_run("kimi-k25-b2")
    wait_ready(second, operator)
    second_output.mkdir(parents=True, exist_ok=True)
    (second_output / "manifest.json").write_text("{}")
    server = statefulsets.get(name=f"{second}-server", namespace=namespace)
    refused = refused_calls(operator)  # the rendered RBAC covered every call the operator made
    assert not refused, "\n".join(refused[:5])

    # --- uninstall: no operator object left; the CRD, the run, its server and its output stay ---------
    tools.run("helm", "uninstall", release, *helm, "--wait", "--timeout", "60s")
    operator.stop()  # its pod went with the Deployment
    selector = f"app.kubernetes.io/instance={release}"
    leftovers: dict[str, Any] = {
        "Deployment": deployments,
        "ReplicaSet": control_plane.resource("apps/v1", "ReplicaSet"),
        "Pod": control_plane.resource("v1", "Pod"),
        "ServiceAccount": control_plane.resource("v1", "ServiceAccount"),
        "ClusterRole": control_plane.resource("rbac.authorization.k8s.io/v1", "ClusterRole"),
        "ClusterRoleBinding": control_plane.resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        "Role": control_plane.resource("rbac.authorization.k8s.io/v1", "Role"),
        "RoleBinding": control_plane.resource("rbac.authorization.k8s.io/v1", "RoleBinding"),
        "ClusterKopfPeering": control_plane.resource("kopf.dev/v1", "ClusterKopfPeering"),
    }

    def nothing_left() -> bool:
        return not any(resource.get(label_selector=selector).items for resource in leftovers.values())

    wait_until(nothing_left, timeout=30, describe=f"no object labelled {selector}")
    assert tools.run("helm", "status", release, *helm, check=False).returncode != 0
    assert condition_status(crds.get(name="datagenruns.datagen.dev").to_dict(), "Established") == "True"
    kept = runs.get(name=second, namespace=namespace).to_dict()
    assert condition_status(kept, "ServerReady") == "True"
    assert statefulsets.get(name=f"{second}-server", namespace=namespace).metadata.uid == server.metadata.uid
    assert (second_output / "manifest.json").read_text() == "{}"
    assert (first_output / "manifest.json").read_text() == "{}"
    listed = tools.run("kubectl", kubeconfig, "-n", namespace, "get", "dgr", "-o", "name").stdout
    assert listed.split() == [f"datagenrun.datagen.dev/{second}"]


def test_namespaced_install_serves_and_may_touch_only_its_namespace(
    tools: Tools,
    control_plane: Cluster,
    namespace: str,
    run_as_service_account: SubjectRunner,
    sim: SimServer,
    kubelet: PodRunner,
    tmp_path: Path,
    leftovers: Leftovers,
) -> None:
    """ci/namespaced-values.yaml: the operator in the release namespace serves runs in another one, with
    a Role there and nothing cluster-wide."""
    namespaces = control_plane.resource("v1", "Namespace")
    watched = f"{namespace}-runs"
    namespaces.create(body={"metadata": {"name": watched, "labels": {"datagen.dev/test": "true"}}})
    leftovers.extra_namespaces.append(watched)
    runs = control_plane.resource(RUN_API, "DataGenRun")
    release, probe_port = f"ns-{secrets.token_hex(2)}", free_port()
    helm = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    values = ["-f", str(CHART / "ci" / "namespaced-values.yaml"), "--set", f"watch.namespaces={{{watched}}}"]
    # no PodMonitor: this cluster has no prometheus-operator CRDs
    values += ["--set", f"probes.port={probe_port}", "--set", "metrics.podMonitor.enabled=false"]
    values += ["--set", f"metrics.operator.port={free_port()}"]
    leftovers.releases.append((release, namespace))
    leftovers.run_namespaces += [namespace, watched]
    tools.run("helm", "install", release, str(CHART), *helm, *values)
    deployment = control_plane.resource("apps/v1", "Deployment").get(
        name=f"{release}-datagen-operator", namespace=namespace
    )
    operator = start_local_operator(run_as_service_account, deployment.to_dict(), sim, probe_port, namespace)
    data, models = tmp_path / "data", tmp_path / "models"
    data.mkdir(), models.mkdir()
    elsewhere = example_run(namespace, data, models)  # the release namespace is not watched
    runs.create(body=elsewhere, namespace=namespace)
    served = example_run(watched, data, models)
    runs.create(body=served, namespace=watched)
    name = served["metadata"]["name"]

    def ready() -> bool:
        return condition_status(runs.get(name=name, namespace=watched).to_dict(), "ServerReady") == "True"

    wait_until(ready, timeout=60, describe=f"{watched}/{name} ServerReady=True", watched=[operator])
    ignored = runs.get(name=elsewhere["metadata"]["name"], namespace=namespace).to_dict()
    assert not ignored.get("status") and not ignored["metadata"].get("finalizers")
    assert not refused_calls(operator), refused_calls(operator)[:5]

    # What the ServiceAccount may do, asked of the API server itself.
    account = control_plane.kubeconfig_for_service_account(namespace, "datagen-controller", create=False)

    def can(*args: str) -> bool:
        result = tools.run("kubectl", f"--kubeconfig={account}", "auth", "can-i", *args, check=False)
        return result.stdout.strip() == "yes"

    assert can("patch", "datagenruns.datagen.dev/status", "-n", watched)
    assert can("create", "statefulsets.apps", "-n", watched)
    assert not can("list", "datagenruns.datagen.dev", "-n", namespace)
    assert not can("list", "datagenruns.datagen.dev", "--all-namespaces")
    assert not can("get", "secrets", "-n", watched)
    assert not can("delete", "pods", "-n", watched)

    tools.run("helm", "uninstall", release, *helm, "--wait", "--timeout", "60s")
    operator.stop()
    roles = control_plane.resource("rbac.authorization.k8s.io/v1", "Role")
    assert not roles.get(namespace=watched, label_selector=f"app.kubernetes.io/instance={release}").items
    assert runs.get(name=name, namespace=watched)  # the run stays
