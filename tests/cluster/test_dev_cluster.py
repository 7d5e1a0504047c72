"""`make dev-cluster` as a user runs it: started in the foreground, the examples applied with plain
`kubectl apply`, the quickstart to Succeeded with one server pod creation, the seeds' wrong parser
halted on what its own simulator answers, Kueue's queues as it prints them (the fake nodes' GPUs as
quota) and of the two queued examples one waiting `Queued` in Kueue's words; then Ctrl-C leaving no
process and no open port behind."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas
import pytest
import yaml

from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.k8s.server_manifests import server_urls
from tests.harness.kubeconfig import read_cluster_endpoint
from tests.harness.processes import wait_until
from tests.harness.testbin import REPO_ROOT, ensure_testbin

EXAMPLES = REPO_ROOT / "examples" / "dev-cluster"
PR_SET_CHILD_SUBREAPER = 36


def load_dev_cluster() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_cluster", REPO_ROOT / "hack" / "dev-cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# --- the pieces ------------------------------------------------------------------------------------


def test_a_server_pods_simulator_gets_its_sglang_flags_with_local_paths() -> None:
    pod = {
        "spec": {
            "containers": [
                {
                    "command": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/k2"],
                    "args": ["--host", "0.0.0.0", "--port=30000", "--reasoning-parser", "kimi", "--enable-metrics"],
                    "volumeMounts": [{"name": "model", "mountPath": "/models/k2"}],
                }
            ],
            "volumes": [{"name": "model", "hostPath": {"path": "/dev-cluster/models/kimi-k2.5"}}],
        }
    }
    flags = load_dev_cluster().simulator_flags(pod, {"/dev-cluster": "/home/me/.dev-cluster"})
    assert flags == ["--model-path", "/home/me/.dev-cluster/models/kimi-k2.5", "--reasoning-parser", "kimi",
                     "--enable-metrics"]  # fmt: skip


def test_the_endpoint_override_names_each_replicas_pod() -> None:
    spec = DataGenRunSpec.model_validate(
        yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())["spec"] | {"server": {"gpus": 8, "replicas": 2}}
    )
    urls = server_urls("quickstart", "team-a", spec, ("http://127.0.0.1:9/{namespace}/{pod}",))
    assert urls == ["http://127.0.0.1:9/team-a/quickstart-server-0", "http://127.0.0.1:9/team-a/quickstart-server-1"]


# --- the whole thing -------------------------------------------------------------------------------


def _children_of_this_process(*, zombies: bool = False) -> set[int]:
    """Living children of this process (or, with zombies=True, exited ones not yet reaped)."""
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(parent) == os.getpid() and (state == "Z") == zombies:
                children.add(int(stat.parent.name))
    return children


@pytest.fixture
def subreaper() -> Iterator[Callable[[], set[int]]]:
    """This process adopts every orphan of its descendants, so a process the dev cluster leaves behind
    (whatever session or group it moved to) shows up as a child here. Yields: new living children now."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = _children_of_this_process() | _children_of_this_process(zombies=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        # The check can fail: the orphan of a shell that has exited is adopted here.
        shell = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        orphan = int(shell.stdout)
        assert orphan in _children_of_this_process() - before
        os.kill(orphan, signal.SIGKILL)
        os.waitpid(orphan, 0)
        yield lambda: _children_of_this_process() - before
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in _children_of_this_process() - before:  # the test fails, but nothing keeps running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        for pid in _children_of_this_process(zombies=True) - before:  # adopted ones that have exited
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _describe(pids: set[int]) -> str:
    lines = []
    for pid in sorted(pids):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            lines.append(f"{pid}: {command[:200]}")
    return "\n".join(lines)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_make_dev_cluster_runs_both_examples_and_ctrl_c_leaves_nothing(
    tmp_path: Path, subreaper: Callable[[], set[int]]
) -> None:
    kubectl = ensure_testbin() / "kubectl"
    state, log_path = tmp_path / "state", tmp_path / "dev-cluster.log"
    # -o: never rebuild the venv from under the running tests. Its own session, so SIGINT to the group
    # below is what a terminal's Ctrl-C sends to the foreground job (make and the script).
    make = ["make", "--no-print-directory", "-o", ".venv/.installed", "dev-cluster", f"DEV_CLUSTER_ARGS=--dir {state}"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(make, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output() -> str:
        return log_path.read_text(errors="replace")

    seen: list[str] = []
    """What the queued runs' conditions said, each change once: a failed wait names the path, not only its end."""

    def wait(what: str, check: Callable[[], Any], timeout: float) -> Any:
        def details() -> str:
            return "\n".join(["conditions seen:", *seen, output()[-6000:]])

        return wait_until(check, timeout=timeout, describe=what, watched=[process], interval=1, details=details)

    try:
        wait("the dev cluster to be up", lambda: "Ctrl-C stops everything" in output(), 300)
        kubeconfig = state / "kubeconfig"
        assert f"export KUBECONFIG={kubeconfig}" in output()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

        def kubectl_(*args: str) -> str:
            result = subprocess.run([str(kubectl), *args], env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
            return result.stdout

        # Kueue's objects as the dev cluster says it made them: the quota is every GPU the nodes offer.
        nodes = json.loads(kubectl_("get", "nodes", "-o", "json"))["items"]
        gpus = sum(int((node["status"].get("allocatable") or {}).get("nvidia.com/gpu", 0)) for node in nodes)
        assert gpus == 16, f"two fake 8-GPU nodes by default: {gpus} GPUs"
        cluster_queue = json.loads(kubectl_("get", "clusterqueues.kueue.x-k8s.io", "dev-gpus", "-o", "json"))
        (group,) = cluster_queue["spec"]["resourceGroups"]
        (flavor,) = group["flavors"]
        quota = {resource["name"]: resource["nominalQuota"] for resource in flavor["resources"]}
        assert quota["nvidia.com/gpu"] == str(gpus), quota
        assert cluster_queue["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority", cluster_queue["spec"]
        local_queue = json.loads(kubectl_("get", "localqueues.kueue.x-k8s.io", "gpus", "-n", "default", "-o", "json"))
        assert local_queue["spec"]["clusterQueue"] == "dev-gpus"
        active = [c for c in local_queue["status"]["conditions"] if c["type"] == "Active"]
        assert [c["status"] for c in active] == ["True"], local_queue["status"]
        classes = json.loads(kubectl_("get", "workloadpriorityclasses.kueue.x-k8s.io", "-o", "json"))["items"]
        assert {c["metadata"]["name"]: c["value"] for c in classes} == {"datagen-low": 100, "datagen-high": 1000}
        assert f"LocalQueue gpus -> ClusterQueue dev-gpus ({gpus} nvidia.com/gpu" in output()

        kubectl_("apply", "-f", str(EXAMPLES / "quickstart.yaml"), "-f", str(EXAMPLES / "misconfigured.yaml"))

        def conditions(name: str) -> dict[str, dict[str, Any]]:
            run = json.loads(kubectl_("get", "dgr", name, "-o", "json"))
            return {c["type"]: c for c in (run.get("status") or {}).get("conditions") or []}

        def status_is(name: str, **wanted: str) -> dict[str, dict[str, Any]] | None:
            found = conditions(name)
            ok = all(found.get(type_, {}).get("status") == status for type_, status in wanted.items())
            return found if ok else None

        wait("quickstart Succeeded=True", lambda: status_is("quickstart", Succeeded="True"), 300)
        halted = wait(
            "misconfigured Succeeded=False, ServerReady=False",
            lambda: status_is("misconfigured", Succeeded="False", ServerReady="False"),
            180,
        )
        # It halted on what its server answered: the parser check, not the spec.
        assert halted["ParsersVerified"]["status"] == "False", halted
        assert "`kimi`" in halted["ParsersVerified"]["message"], halted

        # Exactly one server pod creation per run, as the StatefulSet controller reports it.
        events = json.loads(kubectl_("get", "events", "--field-selector", "reason=SuccessfulCreate", "-o", "json"))
        creations = {
            name: sum(e.get("count") or 1 for e in events["items"] if e["involvedObject"]["name"] == name)
            for name in ("quickstart-server", "misconfigured-server")
        }
        assert creations == {"quickstart-server": 1, "misconfigured-server": 1}, creations
        # Each pod got a simulator started with its own flags (the wrong parser for the misconfigured one).
        started = re.findall(r"server pod default/(\S+): simulator started with (.*) \(log", output())
        assert sorted(pod for pod, _ in started) == ["misconfigured-server-0", "quickstart-server-0"], started
        flags = dict(started)
        assert "--reasoning-parser kimi " in flags["misconfigured-server-0"]
        assert "--reasoning-parser kimi_k2 " in flags["quickstart-server-0"]

        out = state / "data" / "out"
        prompts = len((REPO_ROOT / "examples" / "prompts" / "quickstart.jsonl").read_text().splitlines())
        records = sum(len(pandas.read_parquet(f)) for f in (out / "quickstart" / "data").glob("*.parquet"))
        assert records == prompts, f"{records} quickstart records in the host folder for {prompts} prompts"
        bulk = [*(out / "misconfigured").rglob("*.parquet"), *(out / "misconfigured").rglob("shards/*/*.jsonl")]
        assert not bulk, f"bulk records of a halted run: {bulk}"

        # Two runs behind the LocalQueue, each asking all 16 GPUs: Kueue admits one (either) and holds the other,
        # which says so in Kueue's words.
        queued_runs = ("queued-a", "queued-b")
        kubectl_("apply", *(arg for run in queued_runs for arg in ("-f", str(EXAMPLES / f"{run}.yaml"))))

        where = "queued by Kueue in LocalQueue gpus (ClusterQueue dev-gpus): "

        def one_queued_in_kueues_words() -> tuple[str, str] | None:
            progressing = {run: conditions(run).get("Progressing", {}) for run in queued_runs}
            for run, c in progressing.items():
                said = f"{run}: Progressing={c.get('status')} {c.get('reason')}: {c.get('message')}"
                if said not in seen:
                    seen.append(said)
            for workload in json.loads(kubectl_("get", "workloads.kueue.x-k8s.io", "-o", "json"))["items"]:
                reserved = [
                    c for c in (workload.get("status") or {}).get("conditions") or [] if c["type"] == "QuotaReserved"
                ]
                said = f"workload {workload['metadata']['name']}: {reserved}"
                if said not in seen:
                    seen.append(said)
            # Kueue's words follow where it queues the run (its Workload read); the operator's own words for the
            # moments around them (no Workload yet, admitted with the gate still on, not considered yet) do not.
            waiting = [
                (run, c["message"])
                for run, c in progressing.items()
                if c.get("reason") == "Queued"
                and c["message"].startswith(where)
                and c["message"] != f"{where}waiting for Kueue to consider it"
            ]
            return waiting[0] if len(waiting) == 1 else None

        waiting, message = wait(
            "one queued run Progressing=False Queued, in Kueue's words", one_queued_in_kueues_words, 180
        )
        # Kueue's words for a server the quota cannot take. Both runs arrive in one scheduling cycle, where each fits
        # the snapshot alone: the second one nominated is told it no longer fits (scheduler.go `setSkipped`), which
        # Kueue can repeat for minutes (kubernetes-sigs/kueue issue threads). The last CI saw neither run say the
        # quota's words in 180 s, the most likely cause this one; the conditions seen are named if it fails again.
        words = message.removeprefix(where)
        assert words.endswith("insufficient unused quota for nvidia.com/gpu in flavor dev-gpu, 16 more needed") or (
            words == "Workload no longer fits after processing another workload"
        ), message
        assert conditions(waiting)["ServerReady"]["reason"] == "Queued", conditions(waiting)
        assert kubectl_("get", "dgr", waiting, "-o", "jsonpath={.status.phase}") == "Queued"  # kubectl get dgr's PHASE
        # The quota went to the other one, whose server comes up (ServerReady=True, or Succeeded=True if that was
        # missed between polls). Not waited on: the waiting one's turn after it. Here Kueue v0.17.0 was seen keeping
        # a released server's Workload admitted (its finalizer removal lost to a conflict, never retried), its quota
        # held: that wait would judge Kueue, not the dev cluster.
        (admitted,) = set(queued_runs) - {waiting}
        wait(
            f"{admitted} ServerReady=True (or already Succeeded=True)",
            lambda: status_is(admitted, ServerReady="True") or status_is(admitted, Succeeded="True"),
            300,
        )

        # What must be closed afterwards: the API server, the router, the operator's probe and metrics ports.
        values = yaml.safe_load((state / "operator-values.yaml").read_text())
        ports = {
            "kube-apiserver": int(read_cluster_endpoint(kubeconfig).server.rsplit(":", 1)[1]),
            "router": int(re.search(r"behind http://127\.0\.0\.1:(\d+)", output())[1]),  # type: ignore[index]
            "operator probes": values["probes"]["port"],
            "operator metrics": values["metrics"]["operator"]["port"],
        }
        assert all(_port_open(port) for port in ports.values()), ports
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
            process.wait(120)

    assert "stopped; nothing left running" in output(), output()[-3000:]
    left = subreaper()
    assert not left, f"left running after Ctrl-C:\n{_describe(left)}"
    still_open = {name: port for name, port in ports.items() if _port_open(port)}
    assert not still_open, still_open
