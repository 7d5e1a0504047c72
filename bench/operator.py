"""Benchmark: the operator on the real control plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok GPU nodes), as its own ServiceAccount with the rules of k8s/rbac.py, with `--runs` DataGenRuns applied at
once.

    .venv/bin/python bench/operator.py [--runs 100] [--window 60] [--quick]

- first_status_p50_s / _p95_s: over the runs, the time from the API server accepting a DataGenRun to its first
  status write (what `kubectl get dgr` first shows), all `--runs` applied back to back.
- apply_to_pod: the same to its first server pod object (the preflight's verdict first, then the operator's
  spec ConfigMap, RBAC, Services, StatefulSet; then the StatefulSet controller makes the pod).
- writes_per_run_min: with every run in steady state, every POST/PUT/PATCH/DELETE the operator process sends
  to the API server (kopf's and ours: counted inside the operator process at the HTTP client), over
  `--window` seconds, per run per minute. Steady state here: server pods Running on kwok nodes while the
  model "loads" (the operator's own /health_generate probe is refused), the longest wait of a real run.
- rss_mb_<runs>_runs: the operator process's resident memory with those runs.

The preflight pods land on a stand-in CPU node whose kubelet (a `tests.harness.kubelet.PodRunner` that runs no
process) ends each with a passing verdict in its termination message, as the real step writes it: the
preflight's own cost is its pod's, not the operator's, and 100 tokenizer loads at once would measure this
2-core machine instead.

Last line: `first_status_p50_s=<s> first_status_p95_s=<s> writes_per_run_min=<n> rss_mb_<runs>_runs=<m>`
(goals: p95 <= 5 s, <= 2 writes/run/min, <= 250 MB). `--quick`: 2 runs, a 5 s window and settle (the control
plane's start-up is most of its time; tests/test_bench_quick.py runs it as a `cluster` test): figures not judged.

`--generating`: every run generates instead. One SGLang simulator answers every run's health and parser probes
(so each run passes its parser check as a real one does), the stand-in kubelet passes each canary and holds
each worker pod Running, and the bench plays the workers: every `--progress-every` seconds it patches each
run's shard ConfigMap with a higher count, as a worker's publisher does. Over the window it measures the
operator's writes (all, and status writes per second against the bound it keeps,
`progressWritesPerSecond`) and the lag from a count in a shard's ConfigMap to that count in the run's
status.progress.records (goal p95 <= 10 s + the spacing of the workers' own writes is not counted here).
Last line: `progress_lag_p50_s=<s> progress_lag_p95_s=<s> (goal <= 10) status_writes_per_s=<n> (bound <b>)
writes_per_run_min=<n> rss_mb_<runs>_runs=<m>`.
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
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GROUP, VERSION = API_GROUP, API_VERSION


# --- the operator process, instrumented ------------------------------------------------------------


def serve_operator(counts_file: Path, namespace: str) -> int:
    """Runs `datagen operator` in this process, counting API writes at aiohttp (kopf and kubernetes_asyncio)."""
    import aiohttp

    counts: dict[str, Any] = {"writes": 0, "by_kind": {}}
    original = aiohttp.ClientSession._request

    async def counting(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in ("POST", "PUT", "PATCH", "DELETE") and ":9/" not in str(url):
            counts["writes"] += 1
            kind = f"{method.upper()} {_kind_of(str(url))}"
            counts["by_kind"][kind] = counts["by_kind"].get(kind, 0) + 1
        return await original(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = counting  # type: ignore[method-assign]

    def dump() -> None:
        while True:
            counts_file.write_text(json.dumps(counts))
            time.sleep(0.5)

    threading.Thread(target=dump, daemon=True).start()
    from datagen_operator.k8s.main import main

    return main(["--namespace", namespace])


def _kind_of(url: str) -> str:
    """`datagenruns/status`, `events`, `configmaps`...: the resource a write went to, without names."""
    parts = url.split("?")[0].split("/")
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        rest = parts[parts.index("namespaces") + 2 :]
        return "/".join([rest[0], *rest[2:]])
    return parts[-1]


# --- the benchmark ---------------------------------------------------------------------------------


def run_manifest(name: str, shards: int = 4) -> dict[str, Any]:
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
            "clients": {"shards": shards},
            "output": {"path": f"out/{name}", "volume": {"hostPath": {"path": "/data"}}},
        },
    }


PROGRESS_TOTAL = 100_000
"""The stand-in preflight's prompt count in --generating: no run finishes within the window."""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def passing_steps(prompts: int) -> type:
    """A stand-in kubelet for the CPU pods: a preflight or canary pod ends at once with a passing verdict, as
    the real step writes it; a worker pod is held Running (the bench publishes its progress)."""
    from datagen_operator.api.outcome import StepOutcome
    from tests.harness.kubelet import PodRunner, now

    preflight = StepOutcome(True, "Passed", f"{prompts} prompts (bench stand-in)", prompts=prompts).for_storage()
    canary = StepOutcome(True, "Passed", "the canary's answers are faithful (bench stand-in)").for_storage()

    class Runner(PodRunner):
        def _run(self, pod: Any) -> None:
            key = (pod.metadata.namespace, pod.metadata.name)
            self.finished.add(key)
            component = (pod.metadata.labels or {}).get("datagen.dev/component")
            if component == "worker":
                self._write_status(pod, "Running", {"running": {"startedAt": now()}}, ready=True)
                return
            verdict = canary if component == "canary" else preflight
            terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now(), "finishedAt": now(),
                          "message": verdict.decode()}  # fmt: skip
            self._write_status(pod, "Succeeded", {"terminated": terminated}, ready=False)

    return Runner


class Workers:
    """The bench playing every run's one worker: a higher count in its shard ConfigMap every `every_s` seconds,
    each count remembered with when it was written, for the lag to the run's status."""

    def __init__(self, core: Any, namespace: str, runs: list[str], every_s: float) -> None:
        self.core, self.namespace, self.runs, self.every_s = core, namespace, runs, every_s
        self.written: dict[str, list[tuple[float, int]]] = {run: [] for run in runs}
        self.started_at = time.time()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from datagen_operator.api.progress import Counts, ShardProgress

        step = 0
        while not self.stop.is_set():
            step += 1
            began = time.monotonic()
            for run in self.runs:
                records = step * 7
                progress = ShardProgress(
                    shard=0, shard_count=1, state="running", prompts_total=PROGRESS_TOTAL, prompts_done=records,
                    records_total=PROGRESS_TOTAL, counts=Counts(records=records, prompt_tokens=records * 20,
                    output_tokens=records * 300), in_flight=64, tokens_per_s=2100.0, servers_up=1, servers_total=1,
                    started_at=self.started_at, updated_at=time.time(),
                )  # fmt: skip
                body = {"data": {"progress.json": progress.for_storage().decode()}}
                self.core.patch_namespaced_config_map(f"{run}-shard-0", self.namespace, body)
                self.written[run].append((time.monotonic(), records))
            self.stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))

    def lags(self, shown: dict[str, list[tuple[float, int]]], since: float, until: float) -> list[float]:
        """For each count written between `since` and `until`: seconds until the run's status first showed it (or
        more); one never shown, the time to the last look (a lower bound)."""
        out = []
        for run, writes in self.written.items():
            looks = shown.get(run, [])
            for at, records in writes:
                if not since <= at <= until:
                    continue
                first = next((t for t, count in looks if t >= at and count >= records), None)
                out.append((first if first is not None else looks[-1][0]) - at)
        return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds past the last run's start-up writes")
    parser.add_argument("--quick", action="store_true", help="2 runs, 5 s window and settle; figures not judged")
    parser.add_argument("--generating", action="store_true", help="every run generates (see the docstring)")
    parser.add_argument("--progress-every", type=float, default=5.0, help="--generating: the workers' spacing")
    parser.add_argument("--serve-operator", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_operator:
        return serve_operator(args.serve_operator, args.namespace)
    if args.quick:
        args.runs, args.window, args.settle = 2, 15.0 if args.generating else 5.0, 5.0

    from kubernetes import client

    from datagen_operator.k8s.rbac import CLUSTER_RULES
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
    from tests.harness.controlplane import ClusterSettings, LocalControlPlane
    from tests.harness.sim import start_sim
    from tests.harness.testbin import ensure_testbin

    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    nodes = max(2, -(-args.runs // 8))  # one 1-GPU server pod per run, 8 GPUs per fake node
    cluster = LocalControlPlane(workdir, ClusterSettings(gpu_nodes=nodes), testbin=ensure_testbin())
    cluster.start()
    operator: subprocess.Popen[bytes] | None = None
    sim = None
    try:
        if args.generating:
            kimi = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
            sim = start_sim(*kimi, tokenizer_dir=ensure_standin_tokenizer())
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
            "DATAGEN_TEST_SERVER_URLS": sim.url if sim is not None else "http://127.0.0.1:9",
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
            manifest = run_manifest(name, shards=1 if args.generating else 4)
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
            return time.monotonic()

        kubelet = passing_steps(PROGRESS_TOTAL if args.generating else 24)(cluster, workdir / "kubelet").start()
        created: dict[str, float] = {}
        for index in range(args.runs):
            name = f"run-{index:03d}"
            created[name] = create(name)
        first_status: dict[str, float] = {}
        first_pod: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(first_pod) < args.runs:
            if time.monotonic() > deadline:
                missing = sorted(set(created) - set(first_pod))[:5]
                raise SystemExit(f"no server pod within 300 s for {missing}...; see {workdir}/operator.log")
            seen = time.monotonic()
            for run in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
                name = run["metadata"]["name"]
                if run.get("status") and name not in first_status:
                    first_status[name] = seen - created[name]
            for pod in core.list_namespaced_pod(namespace, label_selector="datagen.dev/component=server").items:
                name = pod.metadata.name.rsplit("-server-", 1)[0]
                if name in created and name not in first_pod:
                    first_pod[name] = seen - created[name]
            time.sleep(0.1)
        if args.generating:
            return generating(args, custom, core, namespace, list(created), counts, operator.pid, workdir, kubelet)
        time.sleep(args.settle)  # past the start-up writes of the last runs
        start_counts = json.loads(counts.read_text())
        time.sleep(args.window)
        end_counts = json.loads(counts.read_text())
        before, after = start_counts["writes"], end_counts["writes"]
        kinds = {k: v - start_counts["by_kind"].get(k, 0) for k, v in end_counts["by_kind"].items()}
        writes = (after - before) / args.runs / (args.window / 60)
        rss = rss_mb(operator.pid)
        kubelet.stop()  # after the window: its node's deletion would leave the finished preflight pods terminating
        status_p50, status_p95 = (
            percentile(list(first_status.values()), 50),
            percentile(list(first_status.values()), 95),
        )
        pod_p50, pod_p95 = percentile(list(first_pod.values()), 50), percentile(list(first_pod.values()), 95)
        print(f"operator log: {workdir}/operator.log")
        print(f"{args.runs} runs applied at once in {max(created.values()) - min(created.values()):.1f} s")
        print(f"apply to first status write: p50 {status_p50:.2f} s, p95 {status_p95:.2f} s")
        print(f"apply to server pod: p50 {pod_p50:.2f} s, p95 {pod_p95:.2f} s")
        print(f"steady state: {after - before} API writes in {args.window:.0f} s by the operator for {args.runs} runs")
        print("  by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v))
        print(
            f"first_status_p50_s={status_p50:.2f} first_status_p95_s={status_p95:.2f} "
            f"(goal <= 5) writes_per_run_min={writes:.2f} (goal <= 2) rss_mb_{args.runs}_runs={rss:.0f} (goal <= 250)"
        )
        return 0
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(20)
            except subprocess.TimeoutExpired:
                operator.kill()
        if sim is not None:
            sim.stop()
        cluster.stop()


def generating(
    args: argparse.Namespace,
    custom: Any,
    core: Any,
    namespace: str,
    runs: list[str],
    counts: Path,
    operator_pid: int,
    workdir: Path,
    kubelet: Any,
) -> int:
    """Every run past its canary with its workers' Job made: the bench publishes progress, the window measures."""
    from kubernetes import client

    from datagen_operator.k8s.settings import Settings

    batch = client.BatchV1Api(core.api_client)
    deadline = time.monotonic() + 600
    while True:
        jobs = {j.metadata.name for j in batch.list_namespaced_job(namespace).items}
        waiting = [run for run in runs if f"{run}-workers" not in jobs]
        if not waiting:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"no workers' Job within 600 s for {waiting[:5]}...; see {workdir}/operator.log")
        time.sleep(1.0)
    workers = Workers(core, namespace, runs, args.progress_every)
    workers.thread.start()
    shown: dict[str, list[tuple[float, int]]] = {run: [] for run in runs}
    time.sleep(args.settle)
    since, start_counts = time.monotonic(), json.loads(counts.read_text())
    end = since + args.window
    while time.monotonic() < end:
        seen = time.monotonic()
        for run in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            records = ((run.get("status") or {}).get("progress") or {}).get("records") or 0
            shown[run["metadata"]["name"]].append((seen, int(records)))
        time.sleep(0.5)
    end_counts = json.loads(counts.read_text())
    workers.stop.set()
    kubelet.stop()
    # Counts written at least 20 s before the end (a third of a quick window); one never shown counts as its wait so far (a lower bound).
    lags = workers.lags(shown, since, until=end - min(20.0, args.window / 3))
    writes = end_counts["writes"] - start_counts["writes"]
    kinds = {k: v - start_counts["by_kind"].get(k, 0) for k, v in end_counts["by_kind"].items()}
    status_writes = kinds.get("PATCH datagenruns/status", 0) / args.window
    bound = Settings().progress_writes_per_s
    rss = rss_mb(operator_pid)
    lag_p50, lag_p95 = percentile(lags, 50), percentile(lags, 95)
    print(f"operator log: {workdir}/operator.log")
    print(f"{len(runs)} runs generating, each worker publishing every {args.progress_every:.0f} s")
    print(f"status.progress lag behind the workers' ConfigMaps over {len(lags)} counts: p50 {lag_p50:.1f} s, "
          f"p95 {lag_p95:.1f} s, max {max(lags):.1f} s")  # fmt: skip
    print(f"window: {writes} API writes in {args.window:.0f} s by the operator for {len(runs)} runs")
    print("  by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v))
    print(
        f"progress_lag_p50_s={lag_p50:.1f} progress_lag_p95_s={lag_p95:.1f} (goal <= 10) "
        f"status_writes_per_s={status_writes:.1f} (bound {bound:.0f}) "
        f"writes_per_run_min={writes / len(runs) / (args.window / 60):.2f} rss_mb_{len(runs)}_runs={rss:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
