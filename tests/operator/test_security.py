"""Pod Security admission: a run in a namespace that enforces the `restricted` standard.

Every CPU pod the operator creates (preflight, canary, workers, verify) is admitted there and runs (the test
kubelet runs it), with the volumes `restricted` allows (PersistentVolumeClaims, here bound to hostPath
volumes) and the model mounted from a folder of a shared models volume (model.subPath). The SGLang server pod
is refused, for exactly one reason, as docs/operator.md says: it runs as root (runAsNonRoot). With the
namespace at `baseline` while the server pod is created, the run then goes on under `restricted` to Succeeded,
and its output holds run.yaml and canary.jsonl, so `datagen verify OUTPUT` works without --run.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness.kubelet import PodRunner
from tests.harness.processes import free_port
from tests.harness.sim import SimServer
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name

RESTRICTED_CHECKS = ("allowPrivilegeEscalation", "capabilities", "seccompProfile", "restricted volume types",
                     "hostPath", "privileged", "runAsUser")  # fmt: skip
"""What `restricted` checks besides runAsNonRoot, as its refusal messages name them."""


def enforce(runs: Runs, level: str) -> None:
    labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}
    runs.core.patch_namespace(runs.namespace, {"metadata": {"labels": labels}})


def claim_on_host_folder(runs: Runs, name: str, folder: Path, mode: str) -> str:
    """A PersistentVolumeClaim bound to a hostPath PersistentVolume on `folder`: pods mount the claim (allowed
    by `restricted`), the test kubelet finds the folder behind it."""
    volume = f"{runs.namespace}-{name}"[:63]
    runs.core.create_persistent_volume(
        {
            "metadata": {"name": volume, "labels": {"datagen.dev/test": "true"}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [mode], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(folder)}},
        }
    )  # fmt: skip
    runs.core.create_namespaced_persistent_volume_claim(
        runs.namespace,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": [mode], "storageClassName": "", "volumeName": volume,
                     "resources": {"requests": {"storage": "1Gi"}}},
        },
    )  # fmt: skip
    runs.wait_for(
        f"claim {name} bound",
        lambda: runs.core.read_namespaced_persistent_volume_claim(name, runs.namespace).status.phase == "Bound",
    )
    return volume


def server_refusals(runs: Runs, statefulset: str) -> list[str]:
    events = runs.core.list_namespaced_event(runs.namespace, field_selector=f"involvedObject.name={statefulset}")
    return [e.message for e in events.items if e.reason == "FailedCreate"]


@pytest.fixture
def volumes(runs: Runs) -> Any:
    made: list[str] = []
    yield made
    for volume in made:
        with contextlib.suppress(ApiException):
            runs.core.delete_persistent_volume(volume)


def test_restricted_namespace_admits_and_runs_every_cpu_pod_and_refuses_only_the_root_server(
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    volumes: list[str],
) -> None:
    enforce(runs, "restricted")
    name = new_name("sec")
    volumes.append(claim_on_host_folder(runs, "models", standin_tokenizer.parent, "ReadOnlyMany"))
    volumes.append(claim_on_host_folder(runs, "data", data_dir, "ReadWriteMany"))
    data = {"persistentVolumeClaim": {"claimName": "data"}}
    manifest = cluster_run(
        name, data_dir, standin_tokenizer,
        **{"model.path": "/models/kimi", "model.subPath": standin_tokenizer.name,
           "model.volume": {"persistentVolumeClaim": {"claimName": "models"}}, "dataset.volume": data,
           "output.volume": data},
    )  # fmt: skip
    # The operator asks the server itself before it trusts it: no answer until the simulator starts below.
    sim = SimServer(KIMI, tokenizer_dir=standin_tokenizer, port=free_port())
    operator([sim.url])
    runs.create(manifest)
    try:
        # The preflight pod is admitted under `restricted` and runs: it read the dataset and the tokenizer.
        inputs = runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)
        assert "24 prompts" in inputs["message"]

        # The server pod is refused, for running as root and nothing else.
        refusals = runs.wait_for("the server pod refused", lambda: server_refusals(runs, f"{name}-server"))
        assert 'violates PodSecurity "restricted:latest"' in refusals[0], refusals
        assert "runAsNonRoot != true" in refusals[0], refusals
        assert not [check for check in RESTRICTED_CHECKS if check in refusals[0]], refusals[0]

        # `baseline` admits it (what docs/operator.md asks of a namespace for the server) ...
        enforce(runs, "baseline")
        runs.wait_for("the server pod", lambda: runs.pod_ip(f"{name}-server-0"), timeout=120)
        # ... and every pod after it is admitted under `restricted` again.
        enforce(runs, "restricted")
        sim.spawn()
        sim.wait_ready()
        runs.wait(name, "CanaryPassed", "True", "Passed", timeout=120)
        runs.wait(name, "Succeeded", "True", "Completed", timeout=180)
    finally:
        sim.stop()

    ran = {pod.rsplit("-", 1)[0] if "-workers-" not in pod else f"{name}-workers": code
           for ns, pod, code in kubelet.history if ns == runs.namespace}  # fmt: skip
    assert ran == {f"{name}-{job}": 0 for job in ("preflight", "canary", "workers", "verify")}, kubelet.history
    pods = runs.core.list_namespaced_pod(runs.namespace).items
    for pod in pods:
        if pod.metadata.labels.get("datagen.dev/component") != "server":
            assert pod.spec.security_context.run_as_non_root and pod.spec.security_context.fs_group == 10001

    # The output story: the applied manifest and the canary's records are in the output.
    output = data_dir / "out" / name
    assert (output / "run.yaml").is_file() and (output / "canary.jsonl").stat().st_size > 0
    verify = subprocess.run(
        [str(Path(sys.executable).with_name("datagen")), "verify", str(output), "--json", "--no-fidelity"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    assert '"passed": true' in verify.stdout


def test_copy_the_output_off_a_claim_with_a_reader_pod(
    runs: Runs, kubelet: PodRunner, data_dir: Path, volumes: list[str]
) -> None:
    """docs/operator.md, "Getting the data out": a read-only pod on the output claim, admitted under
    `restricted`. (`kubectl cp` needs a kubelet's exec; the test kubelet has none, so this checks the pod.)"""
    enforce(runs, "restricted")
    volumes.append(claim_on_host_folder(runs, "data", data_dir, "ReadWriteMany"))
    reader = yaml_reader_pod(f"reader-{secrets.token_hex(2)}")
    runs.core.create_namespaced_pod(runs.namespace, reader, dry_run="All")  # admitted: no exception
    reader["spec"]["securityContext"].pop("runAsNonRoot")
    reader["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")
    with pytest.raises(ApiException) as refused:
        runs.core.create_namespaced_pod(runs.namespace, reader, dry_run="All")
    assert "violates PodSecurity" in refused.value.body


def yaml_reader_pod(name: str) -> dict[str, Any]:
    """The reader pod of docs/operator.md, as that page prints it."""
    import yaml

    text = (Path(__file__).parents[2] / "docs" / "operator.md").read_text()
    block = text.split("<!-- reader-pod -->", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    pod = yaml.safe_load(block)
    pod["metadata"]["name"] = name
    return pod


def test_a_one_node_claim_shared_across_nodes_is_a_warning_on_the_run(
    runs: Runs, operator: OperatorFactory, data_dir: Path, standin_tokenizer: Path
) -> None:
    for claim, mode in (("models", "ReadOnlyMany"), ("data", "ReadWriteOnce")):
        runs.core.create_namespaced_persistent_volume_claim(
            runs.namespace,
            {
                "metadata": {"name": claim},
                "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )
    name = new_name("rwo")
    data = {"persistentVolumeClaim": {"claimName": "data"}}
    manifest = cluster_run(  # two shards
        name, data_dir, standin_tokenizer,
        **{"model.volume": {"persistentVolumeClaim": {"claimName": "models"}}, "dataset.volume": data,
           "output.volume": data},
    )  # fmt: skip
    operator(["http://127.0.0.1:9"])
    runs.create(manifest)

    def warnings() -> list[Any]:
        return [e for e in runs.events(name) if e.reason == "StorageAccessMode" and e.type == "Warning"]

    (event,) = runs.wait_for("the access-mode warning", warnings)
    # Posted as the run's transitions are (one poster: refusals handled alike), not through kopf's.
    assert (event.action, event.reporting_component) == ("Reconcile", "datagen-operator"), event
    warning = event.message
    assert warning.startswith("PersistentVolumeClaim data is ReadWriteOnce, but 2 worker shards write the output")
