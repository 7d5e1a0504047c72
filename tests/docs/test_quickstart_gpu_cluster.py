"""docs/quickstart-gpu-cluster.md as a platform engineer follows it: every command block that can run without
GPUs, a registry or a model runs here, in the guide's order, against the test control plane (the CRDs of
crds/, helm and kubectl of hack/testbin), with a fake container engine for `make images`; each other block
says in the guide why it cannot."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docs.guide import Block, command_blocks
from tests.harness.controlplane import Cluster
from tests.harness.testbin import REPO_ROOT, ensure_testbin

GUIDE = REPO_ROOT / "docs" / "quickstart-gpu-cluster.md"
VERSION = next(
    line.split('"')[1] for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
)


def test_every_command_block_runs_here_or_says_why_not() -> None:
    blocks = command_blocks(GUIDE)
    assert blocks, "the guide has no ```bash block"
    unmarked = [block.line for block in blocks if block.runs_here is None]
    assert unmarked == [], f"blocks at lines {unmarked}: precede each with <!-- runs-here --> or <!-- not-here: why -->"
    assert all(block.why_not for block in blocks if block.runs_here is False)
    assert sum(block.runs_here is True for block in blocks) >= len(blocks) / 2


def test_the_guides_image_tag_is_the_charts() -> None:
    chart = yaml.safe_load((REPO_ROOT / "charts" / "datagen-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO_ROOT / "charts" / "datagen-operator" / "values.yaml").read_text())
    assert chart["appVersion"] == VERSION and values["image"]["tag"] == "" and values["workerImage"]["tag"] == ""
    text = GUIDE.read_text()
    assert (
        f"registry.example.com/ml/operator:{VERSION}" in text and f"registry.example.com/ml/datagen:{VERSION}" in text
    )


@pytest.fixture
def shell(control_plane: Cluster, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment the guide's commands run in: its kubectl and helm, the venv's datagen on PATH (as after
    `source .venv/bin/activate`), a fake docker that records its calls, helm's caches out of $HOME."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "docker-calls"
    docker = fake / "docker"
    docker.write_text(f'#!/bin/sh\necho "docker $*" >> "{calls}"\n')
    docker.chmod(0o755)
    path = os.pathsep.join([str(fake), str(ensure_testbin()), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {
        **os.environ,
        "PATH": path,
        "KUBECONFIG": str(control_plane.kubeconfig),
        "DOCKER_CALLS": str(calls),
        **{f"HELM_{kind}_HOME": str(tmp_path / "helm" / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")},
    }
    yield env
    # Whatever the guide left if a block failed part-way: its release and namespaces.
    kubectl = [str(ensure_testbin() / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig)]
    subprocess.run(
        [str(ensure_testbin() / "helm"), "uninstall", "datagen-operator", "-n", "datagen-system", "--ignore-not-found"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [*kubectl, "delete", "namespace", "llm", "datagen-system", "--ignore-not-found", "--wait=false"],
        capture_output=True,
        timeout=120,
    )


def run_block(block: Block, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.body],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, (
        f"the block at line {block.line} failed:\n{block.body}\n{result.stdout}{result.stderr}"
    )
    return result.stdout + result.stderr


def kubectl_json(env: dict[str, str], *args: str) -> Any:
    result = subprocess.run(["kubectl", *args, "-o", "yaml"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_the_guides_commands_run_in_order(shell: dict[str, str]) -> None:
    blocks = [block for block in command_blocks(GUIDE) if block.runs_here]
    said = {}
    for block in blocks:
        first = block.body.split()[0:2]
        said[block.line] = run_block(block, shell)
        if first == ["kubectl", "-n"] and "examples/kimi-k2.5.yaml" in block.body:
            # Before the cleanup block deletes them: what the guide's section 2-6 made.
            check_what_the_guide_made(shell, said)

    images = Path(shell["DOCKER_CALLS"]).read_text().splitlines()
    for name in ("operator", "datagen"):
        tag = f"registry.example.com/ml/{name}:{VERSION}"
        assert any(call.startswith("docker build ") and call.endswith(f"-t {tag} .") for call in images), images
        assert f"docker push {tag}" in images


def check_what_the_guide_made(env: dict[str, str], said: dict[int, str]) -> None:
    output = "".join(said.values())
    # The flags `make images` prints are the ones the guide's helm install passes.
    printed = next(line for line in output.splitlines() if "the chart runs them with" in line)
    install = next(block.body for block in command_blocks(GUIDE) if block.body.startswith("helm install"))
    for flag in printed.split("with ", 1)[1].split(" --set "):
        name, _, value = flag.removeprefix("--set ").partition("=")
        assert name.endswith(".tag") or f"--set {name}={value}" in install, (flag, install)
        assert not name.endswith(".tag") or value == VERSION  # the chart's default tag already
    deployment = kubectl_json(env, "-n", "datagen-system", "get", "deployment", "datagen-operator")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"registry.example.com/ml/operator:{VERSION}"
    environment = {item["name"]: item.get("value") for item in container.get("env", [])}
    assert environment["DATAGEN_WORKER_IMAGE"] == f"registry.example.com/ml/datagen:{VERSION}"
    claims = kubectl_json(env, "-n", "llm", "get", "pvc")["items"]
    assert {c["metadata"]["name"]: c["spec"]["accessModes"] for c in claims} == {
        "models": ["ReadWriteMany"],
        "data": ["ReadWriteMany"],
    }
    job = kubectl_json(env, "-n", "llm", "get", "job", "load-model")
    mount = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
    run = kubectl_json(env, "-n", "llm", "get", "dgr", "kimi-k25-b1")
    assert mount == run["spec"]["model"]["path"]  # the loader fills the directory the run mounts
    # Dataset and output on the one claim the loader pod fills (hence ReadWriteMany above).
    assert run["spec"]["dataset"]["volume"] == run["spec"]["output"]["volume"]
    assert run["spec"]["output"]["volume"]["persistentVolumeClaim"]["claimName"] == "data"
    loader = kubectl_json(env, "-n", "llm", "get", "pod", "data-loader")
    assert loader["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "data"
    assert "valid DataGenRun kimi-k25-b1" in output and "--reasoning-parser kimi_k2" in output
