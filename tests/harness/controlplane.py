"""A real Kubernetes control plane for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok with fake GPU nodes and (on first use) the LeaderWorkerSet and Kueue controllers,
all on loopback, built by hack/testbin/build.sh.

`LocalControlPlane` starts the processes; `ExistingCluster` uses a cluster someone else runs
(DATAGEN_TEST_KUBECONFIG: kind, k3d, ...). Both share `Cluster`: fake GPU nodes, CRDs from crds/,
kubeconfigs that carry a ServiceAccount's token, and subjects (the operator, a worker) run as that
ServiceAccount so RBAC is enforced exactly as in a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.harness.kubeconfig import read_cluster_endpoint, write_kubeconfig
from tests.harness.kueue import KUEUE_GROUP, kueue_manager
from tests.harness.lws import LWS_CRD_NAME, lws_manager
from tests.harness.pki import CertificateAuthority, KeyPair, write_service_account_signing_key
from tests.harness.processes import ControlPlaneError, ManagedProcess, free_port, wait_until
from tests.harness.testbin import REPO_ROOT, ensure_testbin
from tests.harness.webhook_manager import WebhookManager, start_webhook_manager

CRD_DIR = REPO_ROOT / "crds"

# kwok manages only the nodes that carry this annotation, so it never touches real nodes.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"

# The controllers the operator's objects depend on; everything else stays off to keep the start fast.
CONTROLLERS = (
    "garbage-collector-controller",
    "job-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "persistentvolume-binder-controller",  # binds claims to pre-made (hostPath) volumes; no provisioner
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",
    "ttl-after-finished-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # first address of the range
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


# --- objects ------------------------------------------------------------------------------------


def gpu_node_manifest(name: str, *, zone: str, gpus: int = 8) -> dict[str, Any]:
    """A Node as a p5.48xlarge with the NVIDIA GPU operator installed would register, for kwok to run."""
    capacity = {
        "cpu": "192",
        "memory": "2048Gi",
        "pods": "110",
        "ephemeral-storage": "7Ti",
        GPU_RESOURCE: str(gpus),
    }
    allocatable = {**capacity, "cpu": "191", "memory": "1990Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/region": "us-east-1",
                "topology.kubernetes.io/zone": zone,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": GPU_PRODUCT,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": "81559",
                "type": "kwok",
            },
        },
        "spec": {"taints": [GPU_TAINT]},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            # Every field set: strict clients (kubernetes>=37 validates with pydantic) refuse a partial one.
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "kwok",
                "kernelVersion": "fake",
                "containerRuntimeVersion": "fake",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        },
    }


def condition_status(obj: Mapping[str, Any], condition_type: str) -> str | None:
    """The status ("True", "False", "Unknown") of a condition in a plain object, None when absent."""
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == condition_type:
            return str(condition["status"])
    return None


def _node_schedulable(node: Mapping[str, Any]) -> bool:
    # The node-lifecycle controller taints a node not-ready until it sees it Ready; wait for it to
    # lift that, or the first pods hit the scheduler's back-off.
    taints = node.get("spec", {}).get("taints") or []
    lifecycle_taints = [t for t in taints if t["key"].startswith("node.kubernetes.io/")]
    return condition_status(node, "Ready") == "True" and not lifecycle_taints


def _crd_documents(crd_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    documents: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        documents += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return [(path, d) for path, d in documents if d.get("kind") == "CustomResourceDefinition"]


def _api_message(error: Exception) -> str:
    """The `message` of a Kubernetes Status in an ApiException body, else the exception itself."""
    try:
        return str(json.loads(getattr(error, "body", "") or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(error)


# --- the cluster seen from tests ----------------------------------------------------------------


@dataclass
class ClusterSettings:
    gpu_nodes: int = 2
    gpus_per_node: int = 8
    node_name_prefix: str = "gpu-node"
    crd_dir: Path = CRD_DIR
    ready_timeout: float = 120.0


@dataclass
class Cluster:
    """What tests get: an admin kubeconfig, the fake GPU nodes, and ServiceAccount subjects."""

    workdir: Path
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    kubeconfig: Path = field(init=False)
    processes: list[ManagedProcess] = field(default_factory=list, init=False)
    gpu_node_names: list[str] = field(default_factory=list, init=False)
    startup_seconds: float | None = field(default=None, init=False)
    _subjects: list[ManagedProcess] = field(default_factory=list, init=False)
    _dynamic_clients: dict[Path, Any] = field(default_factory=dict, init=False)

    @property
    def logs_dir(self) -> Path:
        path = self.workdir / "logs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes` (sync) ApiClient; admin unless another kubeconfig is given."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def dynamic(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes.dynamic.DynamicClient` (one per kubeconfig): plain objects, no model validation.
        The typed client of kubernetes>=37 validates responses strictly and refuses objects that kwok
        fills in partially."""
        from kubernetes.dynamic import DynamicClient

        path = kubeconfig or self.kubeconfig
        if path not in self._dynamic_clients:
            self._dynamic_clients[path] = DynamicClient(self.api_client(path))
        return self._dynamic_clients[path]

    def resource(self, api_version: str, kind: str, kubeconfig: Path | None = None) -> Any:
        """The dynamic resource for `kind` (e.g. `cluster.resource("v1", "Pod").get(namespace=ns)`)."""
        return self.dynamic(kubeconfig).resources.get(api_version=api_version, kind=kind)

    def start(self) -> None:
        raise NotImplementedError

    def ensure_lws(self) -> None:
        """Makes sure the LeaderWorkerSet controller serves this cluster (started on first use)."""
        raise NotImplementedError

    def ensure_kueue(self) -> None:
        """Makes sure Kueue serves this cluster's namespaces labelled `KUEUE_NAMESPACE_LABEL`
        (started on first use)."""
        raise NotImplementedError

    def stop(self) -> None:
        for subject in reversed(self._subjects):
            subject.stop()
        self._subjects.clear()
        for process in reversed(self.processes):
            process.stop()

    # nodes and CRDs

    def create_gpu_nodes(self) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        nodes = self.resource("v1", "Node")
        zones = ("us-east-1a", "us-east-1b")
        names = [f"{self.settings.node_name_prefix}-{i}" for i in range(self.settings.gpu_nodes)]
        for index, name in enumerate(names):
            manifest = gpu_node_manifest(name, zone=zones[index % len(zones)], gpus=self.settings.gpus_per_node)
            try:
                nodes.create(body=manifest)
            except ApiException as error:
                if error.status != 409:  # left by an earlier run against an existing cluster
                    raise
        self.gpu_node_names = names
        return names

    def wait_for_gpu_nodes(self) -> None:
        nodes = self.resource("v1", "Node")
        wait_until(
            lambda: all(_node_schedulable(nodes.get(name=name).to_dict()) for name in self.gpu_node_names),
            timeout=self.settings.ready_timeout,
            describe=f"nodes {self.gpu_node_names} Ready and untainted by the node lifecycle",
            watched=self.processes,
            interval=0.5,
        )

    def install_crds(self) -> list[str]:
        """Creates (or replaces) every CRD in crds/*.yaml and waits until each is Established."""
        if not self.settings.crd_dir.is_dir():
            return []
        names = []
        for path, crd in _crd_documents(self.settings.crd_dir):
            self.create_or_replace(crd, source=path)
            names.append(crd["metadata"]["name"])
        for name in names:
            self.wait_for_crd(name)
        return names

    def create_or_replace(self, body: dict[str, Any], *, source: Path | str = "the harness") -> None:
        """Creates a cluster-scoped object, or replaces the one of that name; a refusal raises with the
        API server's message and where the object came from."""
        from kubernetes.client.exceptions import ApiException

        resource = self.resource(body["apiVersion"], body["kind"])
        name = body["metadata"]["name"]
        try:
            try:
                resource.create(body=body)
            except ApiException as error:
                if error.status != 409:
                    raise
                body["metadata"]["resourceVersion"] = resource.get(name=name).metadata.resourceVersion
                resource.replace(body=body)
        except ApiException as error:
            raise ControlPlaneError(
                f"the API server refused the {body['kind']} {name} from {source}: {_api_message(error)}"
            ) from error

    def wait_for_crd(self, name: str, timeout: float = 30.0) -> None:
        crds = self.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")

        def established() -> bool:
            return condition_status(crds.get(name=name).to_dict(), "Established") == "True"

        wait_until(established, timeout=timeout, describe=f"CRD {name} Established", watched=self.processes)

    # ServiceAccount subjects

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, *, create: bool = True, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig that authenticates as system:serviceaccount:<namespace>:<name> through a
        token from the TokenRequest API, so the API server applies that account's RBAC and nothing more."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self.api_client())
        if create:
            try:
                core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
            except ApiException as error:
                if error.status != 409:
                    raise
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        token = core.create_namespaced_service_account_token(name, namespace, request).status.token
        endpoint = read_cluster_endpoint(self.kubeconfig)
        directory = self.workdir / "service-accounts"
        directory.mkdir(parents=True, exist_ok=True)
        return write_kubeconfig(
            directory / f"{namespace}.{name}.kubeconfig",
            server=endpoint.server,
            ca_pem=endpoint.ca_pem,
            insecure=endpoint.insecure,
            user_name=f"system:serviceaccount:{namespace}:{name}",
            token=token,
        )

    def start_subject(
        self,
        name: str,
        argv: Sequence[str],
        *,
        namespace: str,
        service_account: str,
        env: Mapping[str, str] | None = None,
    ) -> ManagedProcess:
        """Starts a process (the operator, a worker) whose KUBECONFIG is the ServiceAccount's; it is
        stopped with the cluster, and its log is shown with the components' when a test fails."""
        kubeconfig = self.kubeconfig_for_service_account(namespace, service_account)
        process_env = {**os.environ, **(env or {}), "KUBECONFIG": str(kubeconfig)}
        subject = ManagedProcess.start(name, argv, self.logs_dir, process_env)
        self._subjects.append(subject)
        return subject

    def failure_report(self, lines: int = 25) -> str:
        parts = [f"control plane logs: {self.logs_dir}"]
        for process in [*self.processes, *self._subjects]:
            state = "running" if process.alive() else f"exited {process.popen.returncode}"
            parts.append(f"--- {process.name} ({state}) {process.log_path}\n{process.log_tail(lines)}")
        return "\n".join(parts)


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class LocalControlPlane(Cluster):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok as local processes."""

    testbin: Path = field(default=Path())
    api_port: int = field(default=0, init=False)
    _etcd_data: Path | None = field(default=None, init=False)
    _ca: CertificateAuthority | None = field(default=None, init=False)
    _lws: ManagedProcess | None = field(default=None, init=False)
    _kueue: ManagedProcess | None = field(default=None, init=False)

    def binary(self, name: str) -> str:
        return str(self.testbin / name)

    def start(self) -> None:
        started = time.monotonic()
        try:
            pki_dir = self.workdir / "pki"
            ca = self._ca = CertificateAuthority(pki_dir)
            service_account_key = write_service_account_signing_key(pki_dir)
            etcd_url = self._start_etcd()
            self._start_apiserver(ca, service_account_key, etcd_url)
            self._start_controller_manager(ca, service_account_key)
            self._start_scheduler(ca)
            self._start_kwok()
            self.create_gpu_nodes()
            self.install_crds()
            self.wait_for_gpu_nodes()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        super().stop()
        self._lws = None
        self._kueue = None
        if self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None

    def _component_kubeconfig(self, ca: CertificateAuthority, name: str, user: str) -> Path:
        pair = ca.issue(name, user)
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            server=f"https://127.0.0.1:{self.api_port}",
            ca_pem=ca.pair.cert_pem(),
            user_name=user,
            client=pair,
        )

    def _start_etcd(self) -> str:
        # Removed at stop (etcd preallocates 64 MB of WAL); after a kill -9 pytest's rotation of its
        # temporary folders removes it instead.
        self._etcd_data = self.workdir / "etcd-data"
        client_port, peer_port = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        etcd = ManagedProcess.start(
            "etcd",
            [
                self.binary("etcd"),
                "--name=test",
                f"--data-dir={self._etcd_data}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--unsafe-no-fsync",  # test data: durability costs seconds and buys nothing
                "--log-level=warn",
            ],
            self.logs_dir,
        )
        self.processes.append(etcd)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as response:
                return b'"health":"true"' in response.read()

        wait_until(healthy, timeout=30, describe="etcd healthy", watched=[etcd])
        return client_url

    def _start_apiserver(self, ca: CertificateAuthority, service_account_key: KeyPair, etcd_url: str) -> None:
        self.api_port = free_port()
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", KUBERNETES_SERVICE_IP),
            server=True,
        )
        admin = ca.issue("admin", "admin", organizations=("system:masters",))
        apiserver = ManagedProcess.start(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.pair.cert}",
                "--authorization-mode=Node,RBAC",
                "--anonymous-auth=false",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={service_account_key.cert}",
                f"--service-account-signing-key-file={service_account_key.key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # The `kubernetes` Service cannot point at a loopback address; nothing here needs it.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
            self.logs_dir,
        )
        self.processes.append(apiserver)
        self.kubeconfig = write_kubeconfig(
            self.workdir / "admin.kubeconfig",
            server=f"https://127.0.0.1:{self.api_port}",
            ca_pem=ca.pair.cert_pem(),
            user_name="admin",
            client=admin,
        )
        context = ssl.create_default_context(cafile=str(ca.pair.cert))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        # /readyz includes the RBAC bootstrap roles, so components can authenticate once it is ok.
        wait_until(
            lambda: _https_ok(f"https://127.0.0.1:{self.api_port}/readyz", context),
            timeout=90,
            describe="kube-apiserver /readyz",
            watched=[apiserver],
        )

    def _start_controller_manager(self, ca: CertificateAuthority, service_account_key: KeyPair) -> None:
        kubeconfig = self._component_kubeconfig(ca, "controller-manager", "system:kube-controller-manager")
        port = free_port()
        manager = ManagedProcess.start(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'controller-manager-serving'}",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={service_account_key.key}",
                f"--root-ca-file={ca.pair.cert}",
                f"--cluster-signing-cert-file={ca.pair.cert}",
                f"--cluster-signing-key-file={ca.pair.key}",
                "--cluster-name=datagen-test",
                "--v=1",
            ],
            self.logs_dir,
        )
        self.processes.append(manager)
        self._wait_healthz(manager, port)

    def _start_scheduler(self, ca: CertificateAuthority) -> None:
        kubeconfig = self._component_kubeconfig(ca, "scheduler", "system:kube-scheduler")
        port = free_port()
        scheduler = ManagedProcess.start(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.workdir / 'scheduler-serving'}",
                "--leader-elect=false",
                "--v=1",
            ],
            self.logs_dir,
        )
        self.processes.append(scheduler)
        self._wait_healthz(scheduler, port)

    def _wait_healthz(self, process: ManagedProcess, port: int) -> None:
        # Self-signed serving certificate; /healthz is always allowed without credentials.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        wait_until(
            lambda: _https_ok(f"https://127.0.0.1:{port}/healthz", insecure),
            timeout=60,
            describe=f"{process.name} /healthz",
            watched=[process],
        )

    def _start_kwok(self) -> None:
        self.processes.append(start_kwok(self.binary("kwok"), self.kubeconfig, self.logs_dir))

    def ensure_lws(self) -> None:
        # On first use rather than with the control plane: its 1.2 MB CRD keeps the API server busy
        # for seconds, which sessions without a LeaderWorkerSet need not pay.
        if self._lws is not None:
            return
        assert self._ca is not None, "the control plane is not started"
        self._lws = self._start_lws(self._ca)

    def _start_lws(self, ca: CertificateAuthority) -> ManagedProcess:
        source = self.testbin / "lws"

        def install(crd: dict[str, Any], webhooks: list[dict[str, Any]]) -> None:
            self.create_or_replace(crd, source=source)
            for configuration in webhooks:
                self.create_or_replace(configuration, source=source)
            self.wait_for_crd(crd["metadata"]["name"])

        def dry_run_create(body: dict[str, Any]) -> None:
            resource = self.resource(body["apiVersion"], body["kind"])
            resource.create(body=body, namespace="default", dry_run="All")

        return self._start_manager(lws_manager(ca, source, install), ca, dry_run_create)

    def ensure_kueue(self) -> None:
        # On first use, as LWS: its CRDs (the Workload's alone is 0.7 MB) keep the API server busy.
        if self._kueue is not None:
            return
        assert self._ca is not None, "the control plane is not started"
        # LWS first: Kueue sets up its LeaderWorkerSet integration once that API exists, polling for it with
        # a back-off of up to 2 minutes (jobframework/setup.go), which a later test would wait out.
        self.ensure_lws()
        self._kueue = self._start_kueue(self._ca)

    def _start_kueue(self, ca: CertificateAuthority) -> ManagedProcess:
        source = self.testbin / "kueue"

        def install(crds: list[dict[str, Any]], webhooks: list[dict[str, Any]]) -> None:
            for crd in crds:
                self.create_or_replace(crd, source=source)
            for crd in crds:
                self.wait_for_crd(crd["metadata"]["name"])
            for configuration in webhooks:
                self.create_or_replace(configuration, source=source)

        def dry_run_create(body: dict[str, Any]) -> None:
            self.resource(body["apiVersion"], body["kind"]).create(body=body, dry_run="All")

        return self._start_manager(kueue_manager(ca, source, install), ca, dry_run_create)

    def _start_manager(
        self, manager: WebhookManager, ca: CertificateAuthority, dry_run_create: Callable[[dict[str, Any]], None]
    ) -> ManagedProcess:
        process = start_webhook_manager(
            manager,
            self.binary(f"{manager.name}-manager"),
            ca=ca,
            server=f"https://127.0.0.1:{self.api_port}",
            workdir=self.workdir,
            logs_dir=self.logs_dir,
            dry_run_create=dry_run_create,
            watched=self.processes,
        )
        self.processes.append(process)
        return process


# Without stages of its own kwok uses its default ones; an explicit file keeps a user's
# ~/.kwok/kwok.yaml (kwok's default --config) out of the tests.
_KWOK_CONFIG = "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions: {}\n"


def start_kwok(binary: str, kubeconfig: Path, log_dir: Path) -> ManagedProcess:
    """kwok with its default stages (nodes Ready with leases, pods Running, Job pods Succeeded),
    limited to nodes annotated as fake."""
    config = log_dir.parent / "kwok.yaml"
    config.write_text(_KWOK_CONFIG)
    return ManagedProcess.start(
        "kwok",
        [
            binary,
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION[0]}={KWOK_NODE_ANNOTATION[1]}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.1",
        ],
        log_dir,
    )


@dataclass
class ExistingCluster(Cluster):
    """A cluster someone else runs (kind, k3d, a real one), reached through its admin kubeconfig.

    kwok runs here as a local process against it (the default, `kwok_mode="local"`), or is already
    installed in the cluster with the same annotation selector (`kwok_mode="in-cluster"`). The fake
    GPU nodes are created either way and deleted at the end.
    """

    admin_kubeconfig: Path = field(default=Path())
    kwok_mode: str = "local"

    def start(self) -> None:
        started = time.monotonic()
        if not self.admin_kubeconfig.is_file():
            raise ControlPlaneError(f"DATAGEN_TEST_KUBECONFIG={self.admin_kubeconfig} is not a file")
        self.kubeconfig = self.admin_kubeconfig
        try:
            if self.kwok_mode == "local":
                kwok = shutil.which("kwok") or str(ensure_testbin() / "kwok")
                self.processes.append(start_kwok(kwok, self.kubeconfig, self.logs_dir))
            elif self.kwok_mode != "in-cluster":
                raise ControlPlaneError(f"DATAGEN_TEST_KWOK must be 'local' or 'in-cluster', not {self.kwok_mode!r}")
            self.create_gpu_nodes()
            self.install_crds()
            self.wait_for_gpu_nodes()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def ensure_lws(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.wait_for_crd(LWS_CRD_NAME, timeout=5)
        except (ControlPlaneError, ApiException) as error:
            raise ControlPlaneError(
                f"the LeaderWorkerSet CRD {LWS_CRD_NAME} is not Established in DATAGEN_TEST_KUBECONFIG's cluster "
                f"({error}); install LWS v0.7.0 there (its release manifests) for these tests"
            ) from error

    def ensure_kueue(self) -> None:
        from kubernetes.client.exceptions import ApiException

        name = f"workloads.{KUEUE_GROUP}"
        try:
            self.wait_for_crd(name, timeout=5)
        except (ControlPlaneError, ApiException) as error:
            raise ControlPlaneError(
                f"the Kueue CRD {name} is not Established in DATAGEN_TEST_KUBECONFIG's cluster ({error}); "
                "install Kueue v0.17.0 there, managing the namespaces labelled datagen.dev/kueue=managed"
            ) from error

    def stop(self) -> None:
        from kubernetes.client.exceptions import ApiException

        if self.gpu_node_names:
            nodes = self.resource("v1", "Node")
            for name in self.gpu_node_names:
                with contextlib.suppress(ApiException):
                    nodes.delete(name=name)
        super().stop()
