#!/usr/bin/env python3
"""`make dev-cluster`: the operator on a laptop, in the foreground, until Ctrl-C.

Starts what the cluster tests use (tests/harness): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok with fake 8-GPU nodes, and the test kubelet, a CPU node that runs pods as local
processes. Then it installs the operator the way users do, `helm install` of charts/datagen-operator
(CRDs, RBAC, ServiceAccount, Deployment); the operator's pod lands on the CPU node and runs there as
`datagen operator` under the chart's ServiceAccount token.

Server pods sit on the kwok GPU nodes, where nothing runs. For each one this script starts
`datagen sim-server` with that pod's own SGLang argv (its flags, its model folder), so a run with a
wrong parser really meets a server that answers with that parser. One loopback router in front of
them is the operator's test-only endpoint override (DATAGEN_TEST_SERVER_URLS, set through the chart's
extraEnv): `http://127.0.0.1:<port>/<namespace>/<pod>/...` goes to that pod's simulator, and answers
503 while the pod has none yet (as a loading server would).

hostPath volumes under /dev-cluster/ are folders of the state directory (default .dev-cluster/), the
way kind's extraMounts map a node's folders: /dev-cluster/models/kimi-k2.5 holds the stand-in
tokenizer, /dev-cluster/data the example prompts and the runs' output. examples/dev-cluster/ uses them.

Kueue runs too, as the tests start it (tests/harness/kueue.py, after the LeaderWorkerSet controller), confined
to namespaces labelled KUEUE_NAMESPACE_LABEL; the examples' namespace gets that label, a LocalQueue `gpus`
in front of a ClusterQueue whose GPU quota is what the fake nodes hold, and two WorkloadPriorityClasses.
A run without spec.queue (quickstart.yaml) is not Kueue's: its server takes node GPUs the quota does not see.

SIGINT, SIGTERM or SIGHUP stops everything this script started (pods' processes, simulators, the
router, the control plane) and leaves no process behind; a second Ctrl-C does not cut that short.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # the harness lives in tests/harness


from datagen_operator.engine.launch import LAUNCH_MODULE  # noqa: E402
from datagen_operator.k8s.object_meta import COMPONENT_LABEL  # noqa: E402
from tests.harness.controlplane import (  # noqa: E402
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    ClusterSettings,
    LocalControlPlane,
)
from tests.harness.kubelet import PodRunner, host_path_mounts, map_path  # noqa: E402
from tests.harness.kueue import KUEUE_API_VERSION, KUEUE_NAMESPACE_LABEL  # noqa: E402
from tests.harness.pod_router import PodRouter  # noqa: E402
from tests.harness.processes import ControlPlaneError, wait_until  # noqa: E402
from tests.harness.sim import HOST, SimServer, SimStartError  # noqa: E402
from tests.harness.testbin import ensure_testbin  # noqa: E402

NODE_ROOT = "/dev-cluster"
"""hostPath prefix that the CPU node maps to the state directory."""
PRESET = "kimi-k2.5"
CHART = REPO_ROOT / "charts" / "datagen-operator"
RELEASE = "datagen-operator"
OPERATOR_NAMESPACE = "datagen-system"
TOKEN_SECONDS = 7 * 24 * 3600  # pods' ServiceAccount tokens outlive any laptop session
SERVER_SELECTOR = f"{COMPONENT_LABEL}=server"
RUN_NAMESPACE = "default"
"""Where examples/dev-cluster/ runs go (they name no namespace): Kueue manages it, its LocalQueue is there."""
RESOURCE_FLAVOR = "dev-gpu"
CLUSTER_QUEUE = "dev-gpus"
LOCAL_QUEUE = "gpus"  # not `default`: Kueue would put that one on every StatefulSet and Job of the namespace
PRIORITY_CLASSES = {"datagen-low": 100, "datagen-high": 1000}
# CPU and memory are covered (a run's pods request them) but never what is short: the GPUs are.
AMPLE = {"cpu": "1000", "memory": "100Ti"}


def say(message: str) -> None:
    print(f"[dev-cluster] {message}", flush=True)


def free_socket() -> socket.socket:
    """A listening-ready socket bound to a free loopback port (bound now, so no one else takes it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def free_port() -> int:
    with free_socket() as sock:
        return int(sock.getsockname()[1])


def simulator_flags(pod: dict[str, Any], node_paths: dict[str, str]) -> list[str]:
    """The server pod's SGLang flags for `datagen sim-server`: what follows `-m sglang.launch_server`,
    without --host/--port (the simulator listens on a free loopback port), with each path inside a
    hostPath mount replaced by its local folder."""
    (container,) = pod["spec"]["containers"]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if LAUNCH_MODULE not in argv:
        raise ValueError(f"not an SGLang launch command: {argv}")
    flags = argv[argv.index(LAUNCH_MODULE) + 1 :]
    mounts = host_path_mounts(pod, node_paths)
    kept: list[str] = []
    skip_value = False
    for flag in flags:
        if skip_value:
            skip_value = False
        elif flag in ("--host", "--port"):
            skip_value = True
        elif not flag.startswith(("--host=", "--port=")):
            kept.append(map_path(flag, mounts))
    return kept


# --- the simulators behind the server pods ---------------------------------------------------------


@dataclass
class PodSimulator:
    namespace: str
    pod: str
    uid: str
    server: SimServer


@dataclass
class ServerPodSimulators:
    """One simulator per server pod (by uid: a recreated pod gets a fresh one, as a real server reloads),
    started with the pod's argv, stopped when the pod goes; a loopback router in front of them."""

    cluster: LocalControlPlane
    node_paths: dict[str, str]
    log_dir: Path
    extra_flags: list[str] = field(default_factory=list)
    _by_uid: dict[str, PodSimulator] = field(default_factory=dict)
    _routes: dict[tuple[str, str], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _router: PodRouter | None = None

    @property
    def router_url(self) -> str:
        assert self._router is not None, "started"
        return self._router.url

    @property
    def endpoint_template(self) -> str:
        """The operator's DATAGEN_TEST_SERVER_URLS: it fills in each replica's namespace and pod."""
        assert self._router is not None, "started"
        return self._router.endpoint_template

    def start(self) -> ServerPodSimulators:
        try:
            self._router = PodRouter(self._upstream).__enter__()
        except RuntimeError as error:
            raise ControlPlaneError(str(error)) from error
        thread = threading.Thread(target=self._watch, name="server-pod-watch", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._router is not None:
            self._router.__exit__(None, None, None)
        for thread in self._threads:
            thread.join(timeout=15)
        with self._lock:
            simulators = list(self._by_uid.values())
            self._by_uid.clear()
            self._routes.clear()
        for simulator in simulators:  # signal all first: they shut down in parallel
            simulator.server.terminate()
        for simulator in simulators:
            simulator.server.stop()

    def _upstream(self, namespace: str, pod: str) -> str | None:
        """The pod's simulator once it answers /health; None before, and once the pod went."""
        with self._lock:
            return self._routes.get((namespace, pod))

    # --- server pods -> simulators ------------------------------------------------------------------

    def _watch(self) -> None:
        pods = self.cluster.resource("v1", "Pod")
        while not self._stop.wait(0.5):
            try:
                listed = [p.to_dict() for p in pods.get(label_selector=SERVER_SELECTOR).items]
            except Exception as error:  # the API server may be stopping; the next pass retries
                say(f"listing server pods failed: {error!r}"[:300])
                continue
            live = {
                p["metadata"]["uid"]: p
                for p in listed
                if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
            }
            for uid in set(self._by_uid) - set(live):
                self._stop_simulator(uid)
            for uid, pod in live.items():
                if uid not in self._by_uid:
                    self._start_simulator(pod)

    def _start_simulator(self, pod: dict[str, Any]) -> None:
        namespace, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        try:
            flags = simulator_flags(pod, self.node_paths)
        except ValueError as error:
            say(f"server pod {namespace}/{name}: no simulator ({error})")
            flags = None
        workdir = self.log_dir / f"{namespace}.{name}.{uid[:8]}"
        server = SimServer([*(flags or []), *self.extra_flags], workdir=workdir)
        simulator = PodSimulator(namespace, name, uid, server)
        with self._lock:
            self._by_uid[uid] = simulator
        if flags is None:
            return
        say(f"server pod {namespace}/{name}: simulator started with {' '.join(flags)} (log {server.log_path})")
        server.spawn()
        thread = threading.Thread(target=self._publish_when_ready, args=(simulator,), daemon=True)
        thread.start()

    def _publish_when_ready(self, simulator: PodSimulator) -> None:
        try:
            simulator.server.wait_ready(timeout_s=120)
        except SimStartError as error:
            if not self._stop.is_set():
                say(f"server pod {simulator.namespace}/{simulator.pod}: simulator failed: {error}"[-2000:])
            return
        with self._lock:
            if self._by_uid.get(simulator.uid) is simulator:
                self._routes[(simulator.namespace, simulator.pod)] = simulator.server.url

    def _stop_simulator(self, uid: str) -> None:
        with self._lock:
            simulator = self._by_uid.pop(uid)
            key = (simulator.namespace, simulator.pod)
            if self._routes.get(key) == simulator.server.url:
                del self._routes[key]
        simulator.server.stop()
        say(f"server pod {simulator.namespace}/{simulator.pod} gone: its simulator stopped")


# --- Kueue ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KueueQueues:
    cluster_queue: str
    local_queue: str
    namespace: str
    gpus: int
    """The ClusterQueue's nvidia.com/gpu quota: every GPU of the fake nodes."""
    priority_classes: dict[str, int]


def fake_node_gpus(cluster: LocalControlPlane) -> int:
    """The GPUs the kwok nodes offer (their allocatable), so the quota follows --gpu-nodes."""
    key, value = KWOK_NODE_ANNOTATION
    nodes = cluster.resource("v1", "Node").get().to_dict()["items"]
    return sum(
        int((node["status"].get("allocatable") or {}).get(GPU_RESOURCE, 0))
        for node in nodes
        if (node["metadata"].get("annotations") or {}).get(key) == value
    )


def _active(obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Active" and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or []
    )


def start_kueue(cluster: LocalControlPlane) -> KueueQueues:
    """The testbin's Kueue controller (LWS first, as the tests start it), a ClusterQueue holding all the fake
    nodes' GPUs with preemption of lower priorities, a LocalQueue in the examples' namespace (labelled for
    Kueue), and the priority classes; returns once both queues are Active."""
    cluster.ensure_kueue()
    gpus = fake_node_gpus(cluster)
    if gpus == 0:
        raise ControlPlaneError(f"the fake nodes offer no {GPU_RESOURCE}: no quota to give Kueue")
    key, value = KUEUE_NAMESPACE_LABEL
    cluster.resource("v1", "Namespace").patch(
        name=RUN_NAMESPACE, body={"metadata": {"labels": {key: value}}}, content_type="application/merge-patch+json"
    )
    quota = [{"name": name, "nominalQuota": amount} for name, amount in {**AMPLE, GPU_RESOURCE: str(gpus)}.items()]
    objects: list[tuple[str, dict[str, Any]]] = [
        ("ResourceFlavor", {"metadata": {"name": RESOURCE_FLAVOR}}),
        (
            "ClusterQueue",
            {
                "metadata": {"name": CLUSTER_QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": [*AMPLE, GPU_RESOURCE],
                            "flavors": [{"name": RESOURCE_FLAVOR, "resources": quota}],
                        }
                    ],
                    # A higher-priority workload evicts a lower one when the quota is short.
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                },
            },
        ),
        (
            "LocalQueue",
            {"metadata": {"name": LOCAL_QUEUE, "namespace": RUN_NAMESPACE}, "spec": {"clusterQueue": CLUSTER_QUEUE}},
        ),
        *(
            ("WorkloadPriorityClass", {"metadata": {"name": name}, "value": priority})
            for name, priority in PRIORITY_CLASSES.items()
        ),
    ]
    for kind, body in objects:
        cluster.resource(KUEUE_API_VERSION, kind).create(
            body={"apiVersion": KUEUE_API_VERSION, "kind": kind, **body}, namespace=body["metadata"].get("namespace")
        )
    cluster_queues = cluster.resource(KUEUE_API_VERSION, "ClusterQueue")
    local_queues = cluster.resource(KUEUE_API_VERSION, "LocalQueue")
    wait_until(
        lambda: (
            _active(cluster_queues.get(name=CLUSTER_QUEUE).to_dict())
            and _active(local_queues.get(name=LOCAL_QUEUE, namespace=RUN_NAMESPACE).to_dict())
        ),
        timeout=60,
        describe=f"ClusterQueue {CLUSTER_QUEUE} and LocalQueue {RUN_NAMESPACE}/{LOCAL_QUEUE} Active",
        watched=cluster.processes,
    )
    return KueueQueues(CLUSTER_QUEUE, LOCAL_QUEUE, RUN_NAMESPACE, gpus, dict(PRIORITY_CLASSES))


# --- set-up -----------------------------------------------------------------------------------------


def prepare_state(state: Path) -> dict[str, str]:
    """The folders the examples' hostPath volumes name: a fresh cluster each time, the models cached.
    Returns the CPU node's hostPath mapping."""
    for stale in ("cluster", "node", "simulators", "data/out"):
        shutil.rmtree(state / stale, ignore_errors=True)
    (state / "cluster").mkdir(parents=True)
    models = state / "models" / PRESET
    if not (models / "tokenizer_config.json").exists():
        say(f"building the {PRESET} stand-in tokenizer into {models}")
        datagen = Path(sys.executable).with_name("datagen")
        subprocess.run([str(datagen), "standin-tokenizer", "--preset", PRESET, "--out", str(models)], check=True)
    prompts = state / "data" / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    for source in (REPO_ROOT / "examples" / "prompts").glob("*.jsonl"):
        shutil.copyfile(source, prompts / source.name)
    return {NODE_ROOT: str(state)}


def tool(testbin: Path, name: str, kubeconfig: Path, state: Path) -> Callable[..., str]:
    """Runs the testbin's helm or kubectl against the dev cluster; helm keeps its caches in the state dir."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env |= {f"HELM_{kind}_HOME": str(state / "helm" / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}

    def run(*args: str) -> str:
        result = subprocess.run([str(testbin / name), *args], env=env, capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise ControlPlaneError(f"{name} {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result.stdout

    return run


def install_operator(helm: Callable[..., str], state: Path, endpoint_template: str) -> int:
    """`helm install` of the chart, its probe and metrics ports moved to free ones (they listen on this
    machine); returns the probe port."""
    probe_port = free_port()
    values = {
        "probes": {"port": probe_port},
        "metrics": {"operator": {"port": free_port()}},
        "reconcile": {"resyncSeconds": 2},
        "extraEnv": [{"name": "DATAGEN_TEST_SERVER_URLS", "value": endpoint_template}],
    }
    values_file = state / "operator-values.yaml"
    values_file.write_text(json.dumps(values, indent=2) + "\n")  # JSON is YAML
    say(f"helm install {RELEASE} charts/datagen-operator -n {OPERATOR_NAMESPACE} -f {values_file}")
    helm(
        "install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace", "-f", str(values_file)
    )
    return probe_port


def healthz(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def usage(state: Path, kubeconfig: Path, testbin: Path, operator_log: Path, router: str, kueue: KueueQueues) -> str:
    shown = os.path.relpath(kubeconfig) if kubeconfig.is_relative_to(Path.cwd()) else kubeconfig
    kubectl_hint = "" if shutil.which("kubectl") else f"\n  export PATH={testbin}:$PATH   # kubectl and helm"
    return f"""
The dev cluster is up. In another terminal:

  export KUBECONFIG={shown}{kubectl_hint}
  kubectl apply -f examples/dev-cluster/quickstart.yaml
  kubectl get dgr -w                 # Succeeded in about a minute
  kubectl apply -f examples/dev-cluster/misconfigured.yaml   # the seeds' wrong parser: halts

  Kueue: namespace {kueue.namespace} (label {"=".join(KUEUE_NAMESPACE_LABEL)}), LocalQueue {kueue.local_queue} -> ClusterQueue \
{kueue.cluster_queue} ({kueue.gpus} {GPU_RESOURCE}, preemption withinClusterQueue: LowerPriority),
  WorkloadPriorityClasses {", ".join(f"{name} ({value})" for name, value in kueue.priority_classes.items())}
  kubectl apply -f examples/dev-cluster/queued-a.yaml -f examples/dev-cluster/queued-b.yaml
  kubectl get dgr                    # each wants all {kueue.gpus} GPUs: one runs, the other stays Starting
  kubectl describe dgr queued-b      # the waiting one (either): Progressing=False Queued, in Kueue's words
  kubectl apply -f examples/dev-cluster/urgent.yaml   # datagen-high: Kueue preempts a datagen-low run

  output:        {state / "data" / "out"}
  operator log:  {operator_log}
  component and pod logs: {state / "cluster" / "logs"}, {state / "node"}, {state / "simulators"}
  server pods are answered by simulators behind {router}

Ctrl-C stops everything.
"""


@contextlib.contextmanager
def dev_cluster(state: Path, gpu_nodes: int, sim_flags: list[str]) -> Iterator[LocalControlPlane]:
    node_paths = prepare_state(state)
    with contextlib.ExitStack() as stack:
        testbin = ensure_testbin()
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok")
        # No CRDs here: helm installs the chart's, as it does for users.
        no_crds = state / "cluster" / "no-crds"
        no_crds.mkdir()
        cluster = LocalControlPlane(
            state / "cluster", ClusterSettings(gpu_nodes=gpu_nodes, crd_dir=no_crds), testbin=testbin
        )
        stack.callback(cluster.stop)
        cluster.start()
        kubeconfig = state / "kubeconfig"
        shutil.copyfile(cluster.kubeconfig, kubeconfig)
        say(f"control plane ready in {cluster.startup_seconds:.0f} s; GPU nodes {', '.join(cluster.gpu_node_names)}")

        simulators = ServerPodSimulators(cluster, node_paths, state / "simulators", sim_flags)
        stack.callback(simulators.stop)
        simulators.start()
        kubelet = PodRunner(
            cluster, state / "node", node="cpu-node", node_paths=node_paths, token_seconds=TOKEN_SECONDS
        )
        stack.callback(kubelet.stop)  # first to stop: the operator and the runs' pods
        kubelet.start()

        kueue = start_kueue(cluster)
        say(
            f"Kueue ready: ClusterQueue {kueue.cluster_queue} with {kueue.gpus} {GPU_RESOURCE}, "
            f"LocalQueue {kueue.namespace}/{kueue.local_queue}"
        )
        probe_port = install_operator(tool(testbin, "helm", kubeconfig, state), state, simulators.endpoint_template)
        wait_until(
            lambda: healthz(probe_port),
            timeout=120,
            describe="the operator's /healthz (its pod runs on the CPU node)",
            watched=cluster.processes,
        )
        operator_logs = list((state / "node" / OPERATOR_NAMESPACE).glob("*/container.log"))
        print(
            usage(
                state,
                kubeconfig,
                testbin,
                operator_logs[0] if operator_logs else state / "node",
                simulators.router_url,
                kueue,
            ),
            flush=True,
        )
        yield cluster


def _interrupt(signum: int, frame: object) -> None:
    # A second Ctrl-C must not cut the clean-up short.
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=REPO_ROOT / ".dev-cluster", help="state directory")
    parser.add_argument("--gpu-nodes", type=int, default=2, help="fake 8-GPU nodes (default 2)")
    parser.add_argument(
        "--sim-flag",
        action="append",
        default=["--sim-load-seconds=2"],
        help="extra `datagen sim-server` flag for every server pod's simulator (repeatable), e.g. --sim-speed=gpu",
    )
    args = parser.parse_args(argv)
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), _interrupt)
    state = args.dir.resolve()
    try:
        with dev_cluster(state, args.gpu_nodes, args.sim_flag) as cluster:
            while True:  # until a signal; a dead component ends the session
                dead = [p for p in cluster.processes if not p.alive()]
                if dead:
                    say(f"{dead[0].name} exited; log {dead[0].log_path}:\n{dead[0].log_tail()}")
                    return 1
                time.sleep(1)
    except KeyboardInterrupt:
        say("stopped; nothing left running")
        return 0
    except (ControlPlaneError, subprocess.CalledProcessError) as error:
        say(f"failed: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
