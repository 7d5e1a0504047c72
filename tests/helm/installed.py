"""The installed chart's operator as a local process, and the run the install tests reconcile with it."""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datagen_operator.api.spec import API_GROUP_VERSION
from tests import manifests
from tests.harness.cluster_fixtures import SubjectRunner
from tests.harness.processes import ManagedProcess, wait_until
from tests.harness.sim import SimServer
from tests.harness.testbin import REPO_ROOT

RUN_API = API_GROUP_VERSION


def example_run(namespace: str, data: Path, models: Path) -> dict[str, Any]:
    """examples/kimi-k2.5.yaml as shipped, with its PVCs swapped for hostPath folders: this control plane
    has no volume provisioner, and a folder lets the test see the output survive the uninstall. The folders
    hold what the preflight reads: the Kimi-K2.5 stand-in (tiktoken + remote code) and prompts."""
    from datagen_operator.tokenizer.kimi_tiktoken import build_kimi_tiktoken_standin

    run = manifests.example_run(
        **{
            "metadata.namespace": namespace,
            "spec.model.volume": {"hostPath": {"path": str(models)}},
            "spec.dataset.volume": {"hostPath": {"path": str(data)}},
            "spec.output.volume": {"hostPath": {"path": str(data)}},
        }
    )
    spec = run["spec"]
    if not (models / "tiktoken.model").exists():
        build_kimi_tiktoken_standin(models)
    prompts = data / spec["dataset"]["path"]
    if not prompts.exists():
        prompts.parent.mkdir(parents=True, exist_ok=True)
        prompts.write_bytes((REPO_ROOT / "examples" / "prompts" / "quickstart.jsonl").read_bytes())
    return run


def operator_argv_and_env(deployment: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The operator container's command, args and env as the kubelet would run them, for a local process."""
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    command = list(container["command"]) + list(container.get("args", []))
    assert command[0] == "datagen", command
    command[0] = str(Path(sys.executable).with_name("datagen"))  # the image's entry point, from this venv
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = f"{deployment['metadata']['name']}-local"
        else:
            raise AssertionError(f"no local stand-in for env {var}")
    return command, env


def healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_local_operator(
    run_as_service_account: SubjectRunner,
    deployment: dict[str, Any],
    sim: SimServer,
    probe_port: int,
    namespace: str,
) -> ManagedProcess:
    """The installed Deployment's operator as a local process, as its ServiceAccount; waits for /healthz."""
    argv, env = operator_argv_and_env(deployment)
    env["DATAGEN_TEST_SERVER_URLS"] = sim.url  # test-only: the server pod is a kwok fake
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    name = f"operator-{deployment['metadata']['name']}"
    process = run_as_service_account(name, argv, service_account, namespace=namespace, env=env)
    wait_until(lambda: healthz(probe_port), timeout=30, describe="kopf's /healthz", watched=[process])
    return process


def refused_calls(process: ManagedProcess) -> list[str]:
    """403s in the operator's log: each one is a call the rendered RBAC does not grant (kopf's own CRD and
    namespace scanning is off in the operator, so it asks for neither)."""
    return [line for line in process.log_path.read_text().splitlines() if "forbidden" in line.lower()]


@dataclass
class Leftovers:
    """What a test leaves to tear down even when it fails: releases to uninstall, then namespaces whose
    runs lost their operator (their finalizer is stripped so the namespace can go), extra namespaces."""

    releases: list[tuple[str, str]] = field(default_factory=list)
    run_namespaces: list[str] = field(default_factory=list)
    extra_namespaces: list[str] = field(default_factory=list)
