"""k8s.rbac: the operator's own permissions, least privilege, as the chart renders them."""

from __future__ import annotations

import pytest

from datagen_operator.k8s.rbac import CLUSTER_RULES, cluster_role


def test_rbac_is_least_privilege() -> None:
    verbs = {(g, r): set(rule["verbs"]) for rule in CLUSTER_RULES for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "secrets") not in verbs
    assert "delete" not in verbs[("", "pods")] and "delete" not in verbs[("", "configmaps")]
    assert all("*" not in v for v in verbs.values())
    assert cluster_role()["kind"] == "ClusterRole"


def test_print_rbac_for_the_chart(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from datagen_operator.k8s.main import main

    assert main(["--print-rbac"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == cluster_role()
