"""The chart as rendered by the pinned helm v4: lint, the CRD from the one generated file, RBAC equal to
the operator's own rules (operator/datagen_operator/k8s/rbac.py), the Deployment's contract with
`datagen operator`, and the values schema refusing mistakes. No API server needed (test_install.py has those)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from datagen_operator.k8s import rbac
from datagen_operator.k8s.main import build_parser
from datagen_operator.k8s.settings import DEFAULT_WORKER_IMAGE
from tests.harness.testbin import REPO_ROOT
from tests.helm.conftest import CHART, CI_VALUES, Tools, by_kind, one

NAMESPACED = CHART / "ci" / "namespaced-values.yaml"
HA = CHART / "ci" / "ha-values.yaml"

# kopf's own calls for peering (keep-alives in the peering object's status); not the operator's
# reconcile calls, so not in rbac.py: the chart adds exactly this when peering is on.
KOPF_PEERING_RULE = {"apiGroups": ["kopf.dev"], "verbs": ["get", "list", "watch", "patch"]}


def canonical(rules: list[dict[str, Any]]) -> list[str]:
    """Rules as sorted JSON strings: order is irrelevant to RBAC, every field and verb is not."""
    return sorted(json.dumps(rule, sort_keys=True) for rule in rules)


def rules_diff(rendered: list[dict[str, Any]], expected: list[dict[str, Any]]) -> str:
    extra = sorted(set(canonical(rendered)) - set(canonical(expected)))
    missing = sorted(set(canonical(expected)) - set(canonical(rendered)))
    return (
        "the chart's RBAC differs from operator/datagen_operator/k8s/rbac.py "
        "(edit charts/datagen-operator/templates/rbac.yaml to match):\n"
        f"  only in the chart: {extra}\n  only in rbac.py:  {missing}"
    )


def operator_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(documents, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_lint_strict_with_default_and_ci_values(tools: Tools) -> None:
    for values in (None, *CI_VALUES):
        args = ["lint", "--strict", str(CHART), *(["-f", str(values)] if values else [])]
        result = tools.run("helm", *args)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_cluster_rbac_is_exactly_the_operators_rules(tools: Tools) -> None:
    documents = tools.template(namespace="ops")
    role, binding = one(documents, "ClusterRole"), one(documents, "ClusterRoleBinding")
    expected = [dict(rule) for rule in rbac.CLUSTER_RULES]
    assert canonical(role["rules"]) == canonical(expected), rules_diff(role["rules"], expected)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    service_account = one(documents, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": service_account["metadata"]["name"], "namespace": "ops"}
    ]
    assert not by_kind(documents, "Role") and not by_kind(documents, "RoleBinding")  # nothing else grants


def test_namespaced_rbac_is_the_same_rules_in_each_watched_namespace(tools: Tools) -> None:
    documents = tools.template(values=[NAMESPACED], namespace="ops")
    roles, bindings = by_kind(documents, "Role"), by_kind(documents, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    expected = [dict(rule) for rule in rbac.CLUSTER_RULES]
    for role in roles:
        assert canonical(role["rules"]) == canonical(expected), rules_diff(role["rules"], expected)
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        # the operator's own ServiceAccount, in the release namespace
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "datagen-controller", "namespace": "ops"}]
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"}
    assert not [d["kind"] for d in documents if d["kind"] in cluster_scoped]


def test_peering_adds_only_kopfs_peering_rule(tools: Tools) -> None:
    documents = tools.template(values=[HA])
    role = one(documents, "ClusterRole")
    expected = [*map(dict, rbac.CLUSTER_RULES), {**KOPF_PEERING_RULE, "resources": ["clusterkopfpeerings"]}]
    assert canonical(role["rules"]) == canonical(expected), rules_diff(role["rules"], expected)
    peering = one(documents, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "datagen-operator-ha"
    # A namespaced operator peers in each namespace it serves.
    namespaced = tools.template("--set", "peering.enabled=true", values=[NAMESPACED], namespace="ops")
    assert sorted(p["metadata"]["namespace"] for p in by_kind(namespaced, "KopfPeering")) == ["team-a", "team-b"]
    for role in by_kind(namespaced, "Role"):
        assert {**KOPF_PEERING_RULE, "resources": ["kopfpeerings"]} in role["rules"]


def test_no_peering_object_or_rule_with_one_replica(tools: Tools) -> None:
    documents = tools.template()
    assert not by_kind(documents, "ClusterKopfPeering") and not by_kind(documents, "KopfPeering")
    assert one(documents, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}  # never two standalone operators


def test_crds_are_the_generated_file_also_when_packaged(tools: Tools, tmp_path: Path) -> None:
    generated = yaml.safe_load((REPO_ROOT / "crds" / "datagenrun.yaml").read_text())
    link = CHART / "crds" / "datagenrun.yaml"
    assert link.is_symlink() and link.resolve() == (REPO_ROOT / "crds" / "datagenrun.yaml").resolve()
    tools.run("helm", "package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("datagen-operator-*.tgz")
    for source in (CHART, package):
        crds = [d for d in yaml.safe_load_all(tools.run("helm", "show", "crds", str(source)).stdout) if d]
        names = sorted(d["metadata"]["name"] for d in crds)
        assert names == ["clusterkopfpeerings.kopf.dev", "datagenruns.datagen.dev", "kopfpeerings.kopf.dev"]
        (datagen,) = (d for d in crds if d["metadata"]["name"] == "datagenruns.datagen.dev")
        assert datagen == generated, f"the CRD in {source} is not crds/datagenrun.yaml"


def test_deployment_runs_datagen_operator_with_kopfs_probe(tools: Tools) -> None:
    container = operator_container(tools.template("--set", "probes.port=18080"))
    assert container["command"] == ["datagen", "operator"]
    args = build_parser().parse_args(container["args"])  # the operator's own parser accepts them
    assert args.liveness == "http://0.0.0.0:18080/healthz"
    assert args.namespace == []  # all namespaces
    assert container["ports"][0] == {"name": "probes", "containerPort": 18080, "protocol": "TCP"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "probes"}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["DATAGEN_WORKER_IMAGE"] == DEFAULT_WORKER_IMAGE  # the chart's default is the operator's
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert not [name for name in env if name.startswith("DATAGEN_TEST_")]  # test-only knobs stay out
    assert container["image"] == "ghcr.io/datagen-operator/operator:0.1.0"


def test_restricted_pod_security(tools: Tools) -> None:
    deployment = one(tools.template(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]["securityContext"]
    assert container == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_operator_accepts_the_rendered_args(tools: Tools, values: Path) -> None:
    container = operator_container(tools.template(values=[values], namespace="ops"))
    args = build_parser().parse_args(container["args"])
    if any(a.startswith("--peering") for a in container["args"]):
        assert args.peering, "several replicas need kopf peering"
    if values == NAMESPACED:
        assert args.namespace == ["team-a", "team-b"] and args.verbose
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "DATAGEN_WATCH_NAMESPACE" not in env  # the operator's setting names one namespace only
        assert env["DATAGEN_WORKER_IMAGE"] == "registry.example.com/ml/datagen:0.1.0-cuda"
        assert container["image"].endswith("@sha256:" + "0123456789abcdef" * 4)


def test_one_watched_namespace_defaults_to_the_release_namespace(tools: Tools) -> None:
    documents = tools.template("--set", "watch.scope=namespaces", "--set", "metrics.podMonitor.enabled=true")
    assert one(documents, "Role")["metadata"]["namespace"] == "datagen-system"
    container = operator_container(documents)
    assert "--namespace=datagen-system" in container["args"]
    assert {"name": "DATAGEN_WATCH_NAMESPACE", "value": "datagen-system"} in container["env"]
    assert one(documents, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["datagen-system"]}


def test_no_hooks_so_uninstall_runs_nothing_against_the_data(tools: Tools) -> None:
    for values in ([], *([v] for v in CI_VALUES)):
        for document in tools.template(values=values, namespace="ops"):
            annotations = document["metadata"].get("annotations") or {}
            assert not [key for key in annotations if key.startswith("helm.sh/hook")], document["metadata"]


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("watch.scope=everywhere", "watch.scope"),
        ("watch.namespaces={Team_A}", "watch.namespaces"),
        ("logLevel=trace", "logLevel"),
        ("replica=2", "replica"),  # a typo is refused, not ignored
        ("image.digest=latest", "image.digest"),
        ("probes.port=0", "probes.port"),
        ("grafana.dashboard.enable=true", "enable"),  # the switch is `enabled`
    ],
)
def test_schema_refuses_mistakes(tools: Tools, setting: str, complaint: str) -> None:
    result = tools.run("helm", "template", "dg", str(CHART), "--set", setting, check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert complaint.split(".")[-1] in result.stderr, result.stderr


def test_operator_metrics_service_and_optional_service_monitor(tools: Tools) -> None:
    documents = tools.template("--set", "metrics.operator.serviceMonitor.enabled=true")
    container = operator_container(documents)
    assert "--metrics-port=9090" in container["args"]
    assert build_parser().parse_args(container["args"]).metrics_port == 9090
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics"))
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert one(documents, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"
    plain = tools.template("--set", "metrics.operator.enabled=false")
    assert not any(a.startswith("--metrics-port") for a in operator_container(plain)["args"])
    assert not [d for d in plain if d["kind"] in ("ServiceMonitor",) or d["metadata"]["name"].endswith("-metrics")]


def test_grafana_dashboard_configmap_only_when_enabled(tools: Tools) -> None:
    """Off by default; on, one ConfigMap with the sidecar's label holding the chart's dashboard file as it is."""
    assert not [d for d in tools.template() if d["metadata"]["name"].endswith("-dashboard")]
    documents = tools.template("--set", "grafana.dashboard.enabled=true")
    (configmap,) = [d for d in by_kind(documents, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "datagen-system"
    dashboard = (CHART / "dashboards" / "datagen-operator.json").read_text()
    assert json.loads(configmap["data"]["datagen-operator.json"]) == json.loads(dashboard)
    custom = tools.template(
        "--set",
        "grafana.dashboard.enabled=true,grafana.dashboard.label=dashboards,grafana.dashboard.labelValue=datagen",
        "--set",
        "grafana.dashboard.namespace=monitoring,grafana.dashboard.annotations.grafana_folder=datagen",
    )
    (configmap,) = [d for d in by_kind(custom, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["dashboards"] == "datagen"
    assert "grafana_dashboard" not in configmap["metadata"]["labels"]
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "datagen"}


def test_service_monitor_keeps_the_runs_namespace_label(tools: Tools) -> None:
    """A run's series carry `namespace` (the run's): without honorLabels Prometheus would rename it
    exported_namespace and put the operator's namespace in its place, and the dashboard's filters would miss."""
    documents = tools.template("--set", "metrics.operator.serviceMonitor.enabled=true")
    assert one(documents, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True
