"""Benchmark: the operator on the real control plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok GPU nodes), as its own ServiceAccount with the rules of k8s/rbac.py.

    .venv/bin/python bench/operator.py [--runs 50] [--window 60] [--samples 5]

- apply_to_pod_s: median over `--samples` runs (applied one at a time) of the time from the API server
  accepting a DataGenRun to its first server pod object existing (operator: spec ConfigMap, RBAC,
  Services, StatefulSet; then the StatefulSet controller makes the pod). Also printed: apply to the first
  status write.
- writes_per_run_min: with `--runs` runs in steady state, every POST/PUT/PATCH/DELETE the operator process
  sends to the API server (kopf's and ours: counted inside the operator process at the HTTP client),
  over `--window` seconds, per run per minute. Steady state here: server pods Running on kwok nodes while
  the model "loads" (the operator's own /health_generate probe is refused), the longest wait of a real run.
- rss_mb_50_runs: the operator process's resident memory with those runs.

Last line: `apply_to_pod_s=<s> writes_per_run_min=<n> rss_mb_50_runs=<m>` (goals: < 2 s, <= 10, < 200 MB).
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path and this file would shadow the standard
# library's `operator` module (which enum, re, argparse... import). Take the folder off before importing.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GROUP, VERSION, PLURAL = "datagen.dev", "v1alpha1", "datagenruns"


# --- the operator process, instrumented ------------------------------------------------------------


def serve_operator(counts_file: Path, namespace: str) -> int:
    """Runs `datagen operator` in this process, counting API writes at aiohttp (kopf and kubernetes_asyncio)."""
    import aiohttp

    counts = {"writes": 0}
    original = aiohttp.ClientSession._request

    async def counting(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in ("POST", "PUT", "PATCH", "DELETE") and ":9/" not in str(url):
            counts["writes"] += 1
        return await original(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = counting  # type: ignore[method-assign]

    def dump() -> None:
        while True:
            counts_file.write_text(json.dumps(counts))
            time.sleep(0.5)

    threading.Thread(target=dump, daemon=True).start()
    from datagen_operator.k8s.main import main

    return main(["--namespace", namespace])


# --- the benchmark ---------------------------------------------------------------------------------


def run_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DataGenRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"preset": "kimi-k2.5", "path": "/models/kimi", "volume": {"hostPath": {"path": "/models/kimi"}}},
            "server": {
                "gpus": 1,
                "startupTimeout": "45m",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "dataset": {"path": "p.jsonl", "volume": {"hostPath": {"path": "/data"}}},
            "generation": {"thinking": True, "sampling": {"max_new_tokens": 1024}},
            "clients": {"shards": 4},
            "output": {"path": f"out/{name}", "volume": {"hostPath": {"path": "/data"}}},
        },
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--serve-operator", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_operator:
        return serve_operator(args.serve_operator, args.namespace)

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from datagen_operator.k8s.rbac import CLUSTER_RULES
    from tests.harness.controlplane import ClusterSettings, LocalControlPlane
    from tests.harness.testbin import ensure_testbin

    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    nodes = max(2, -(-args.runs // 8))  # one 1-GPU server pod per run, 8 GPUs per fake node
    cluster = LocalControlPlane(workdir, ClusterSettings(gpu_nodes=nodes), testbin=ensure_testbin())
    cluster.start()
    operator: subprocess.Popen[bytes] | None = None
    try:
        api = cluster.api_client()
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        custom = client.CustomObjectsApi(api)
        namespace = "bench"
        core.create_namespace({"metadata": {"name": namespace}})
        rbac.create_cluster_role({"metadata": {"name": "datagen-operator"}, "rules": [dict(r) for r in CLUSTER_RULES]})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "datagen-operator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "datagen-operator"},
                "subjects": [{"kind": "ServiceAccount", "name": "datagen-operator", "namespace": namespace}],
            }
        )
        kubeconfig = cluster.kubeconfig_for_service_account(namespace, "datagen-operator")
        counts = workdir / "counts.json"
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            # nothing listens on port 9: the "model" never finishes loading (see the module docstring)
            "DATAGEN_TEST_SERVER_URLS": "http://127.0.0.1:9",
        }
        log = (workdir / "operator.log").open("wb")
        operator = subprocess.Popen(
            [sys.executable, __file__, "--serve-operator", str(counts), "--namespace", namespace],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(3.0)  # kopf logs in and starts its watches

        def create(name: str) -> float:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, run_manifest(name))
            return time.monotonic()

        def pod_exists(name: str) -> bool:
            try:
                core.read_namespaced_pod(f"{name}-server-0", namespace)
                return True
            except ApiException as error:
                if error.status == 404:
                    return False
                raise

        def has_status(name: str) -> bool:
            return bool(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status"))

        to_pod: list[float] = []
        to_status: list[float] = []
        for index in range(args.samples):
            name = f"run-{index:03d}"
            started = create(name)
            pending = {"pod": True, "status": True}
            while any(pending.values()):
                if time.monotonic() - started > 60:
                    raise SystemExit(f"{name}: no server pod or status within 60 s; see {workdir}/operator.log")
                if pending["pod"] and pod_exists(name):
                    to_pod.append(time.monotonic() - started)
                    pending["pod"] = False
                if pending["status"] and has_status(name):
                    to_status.append(time.monotonic() - started)
                    pending["status"] = False
                time.sleep(0.02)
        for index in range(args.samples, args.runs):
            create(f"run-{index:03d}")
        deadline = time.monotonic() + 180
        while not all(has_status(f"run-{i:03d}") for i in range(args.runs)):
            if time.monotonic() > deadline:
                raise SystemExit("not every run got a status within 180 s")
            time.sleep(1)
        time.sleep(20)  # past the start-up writes of the last runs
        before = json.loads(counts.read_text())["writes"]
        time.sleep(args.window)
        after = json.loads(counts.read_text())["writes"]
        writes = (after - before) / args.runs / (args.window / 60)
        rss = rss_mb(operator.pid)
        print(f"operator log: {workdir}/operator.log")
        print(
            f"apply to server pod: median {statistics.median(to_pod):.2f} s, max {max(to_pod):.2f} s; "
            f"apply to first status write: median {statistics.median(to_status):.2f} s"
        )
        print(f"steady state: {after - before} API writes in {args.window:.0f} s by the operator for {args.runs} runs")
        print(
            f"apply_to_pod_s={statistics.median(to_pod):.2f} writes_per_run_min={writes:.2f} "
            f"rss_mb_{args.runs}_runs={rss:.0f}"
        )
        return 0
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                operator.kill()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
