"""The committed CRD is exactly what the models generate, and it carries the story's columns and rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from datagen_operator.api.crd import crd_manifest, crd_yaml

CRD_FILE = Path(__file__).resolve().parents[3] / "crds" / "datagenrun.yaml"


def test_committed_crd_is_generated() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/datagenrun.yaml is stale: run `make crd`"


def test_cli_prints_the_same_crd() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "crd"], capture_output=True, text=True, check=True
    )
    assert out.stdout == CRD_FILE.read_text()


def _walk(node: object) -> list[dict]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found += _walk(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk(value)
    return found


def test_crd_identity_and_columns() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "datagenruns.datagen.dev"
    assert spec["names"]["kind"] == "DataGenRun" and spec["names"]["shortNames"] == ["dgr"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    for name, condition in [
        ("Succeeded", "Succeeded"),
        ("Server", "ServerReady"),
        ("Canary", "CanaryPassed"),
        ("Faithful", "DataFaithful"),
    ]:
        assert columns[name] == f'.status.conditions[?(@.type=="{condition}")].status'
    assert columns["Progress"] == ".status.progress.summary"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_schema_is_structural() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "const" not in node and "title" not in node
        if "properties" in node:
            assert node.get("type") == "object"


def test_descriptions_and_cel_rules_are_present() -> None:
    spec_schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    server = spec_schema["properties"]["server"]
    assert "divide gpus" in server["x-kubernetes-validations"][0]["message"]
    assert server["properties"]["gpus"]["minimum"] == 1
    assert "kimi_k2" in server["properties"]["reasoningParser"]["enum"]
    assert "description" in spec_schema["properties"]["model"]["properties"]["preset"]
    rules = " ".join(rule["rule"] for rule in spec_schema["x-kubernetes-validations"])
    assert '"kimi-k2.5": ["kimi_k2"]' in rules
    assert '"qwen3": ["qwen", "qwen25"]' in rules  # spellings SGLang runs as one parser are all accepted
    assert spec_schema["properties"]["server"]["properties"]["startupTimeout"]["default"] == "45m"
