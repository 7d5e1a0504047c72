"""The test plays kubelet where kwok does not: a CPU node for the canary, worker and verify pods.

kwok (fast stages) marks every Job pod Succeeded at once with exit 0 and no termination message, which
would let a Job "finish" without its program ever running. So the test registers its own Node (without
kwok's annotation, so kwok leaves it alone; without the GPU taint, so the CPU pods land here) and runs
each pod bound to it as a real local process:

- the container's command with Kubernetes' $(VAR) expansion (env values, fieldRefs such as the Job's
  completion index annotation, metadata.namespace);
- mounts mapped to local paths: hostPath volumes to their paths, claims to their hostPath PersistentVolume,
  (subPath honoured), emptyDirs to a folder of the pod's, ConfigMap volumes materialised from the API,
  /dev/termination-log to a file whose content becomes the termination message; env values are mapped too;
- a pod whose ServiceAccount token is mounted gets KUBECONFIG for a TokenRequest token of that account, so
  the worker patches its progress ConfigMap under its real Role;
- the pod's status is written the way a kubelet writes it: Running + Ready, then Succeeded/Failed with the
  container's exit code and termination message;
- a deleted pod goes as a kubelet lets it go (graceful deletion): its process gets SIGTERM and the pod's grace
  period (then SIGKILL), the pod gets its terminal phase (Succeeded/Failed with the container's exit and
  termination message, so the Job controller counts it and drops its `batch.kubernetes.io/job-tracking`
  finalizer), and only then the final delete (grace 0). A pod deleted before its container started is Failed.

Server pods stay on kwok's GPU nodes; the simulator on loopback answers for them.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.harness.controlplane import Cluster

VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
DATAGEN = str(Path(sys.executable).with_name("datagen"))


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LocalPod:
    name: str
    namespace: str
    process: subprocess.Popen[bytes]
    workdir: Path
    termination_log: Path
    log_path: Path
    fallback_to_logs: bool
    started: str


@dataclass
class PodRunner:
    cluster: Cluster
    workdir: Path
    node: str = field(default_factory=lambda: f"test-kubelet-{secrets.token_hex(3)}")
    pods: dict[tuple[str, str], LocalPod] = field(default_factory=dict)
    finished: set[tuple[str, str]] = field(default_factory=set)
    history: list[tuple[str, str, int]] = field(default_factory=list)
    """(namespace, pod, exit code) of every process this kubelet ran."""
    started: list[tuple[str, str]] = field(default_factory=list)
    """(namespace, pod) of every pod this kubelet started, in order: counts pods the API has since forgotten."""
    only_label: str | None = None
    """Run only pods carrying this label (others scheduled here stay Pending), e.g. to leave a chart's
    operator Deployment to the test, which runs it itself."""
    node_paths: dict[str, str] = field(default_factory=dict)
    """hostPath prefixes mapped to local folders, as kind's extraMounts map a node's folders to the host
    (e.g. {"/dev-cluster": "<repo>/.dev-cluster"}); a hostPath under no prefix is used as it is."""
    token_seconds: int = 3600
    """Lifetime of the ServiceAccount tokens given to pods (a long-lived dev cluster wants more)."""
    held: set[str] = field(default_factory=set)
    """Component labels (datagen.dev/component) whose pods this kubelet leaves Pending for now, as a node busy
    pulling an image would: a test evicts or deletes them before they start, then takes the label out."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _draining: list[LocalPod] = field(default_factory=list)
    """Processes of deleted pods, given their grace period in the background; stop() ends them too."""

    def __post_init__(self) -> None:
        self.api = self.cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)

    # --- the node -------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self.core.create_node(
            {
                "metadata": {
                    "name": self.node,
                    "labels": {"kubernetes.io/hostname": self.node, "datagen.dev/test-kubelet": "true"},
                }
            }
        )
        self._heartbeat()
        self._thread = threading.Thread(target=self._loop, name="test-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for pod in [*self.pods.values(), *self._draining]:
            _terminate(pod.process, 5)
        with contextlib.suppress(ApiException):
            self.core.delete_node(self.node)

    def _heartbeat(self) -> None:
        stamp = now()
        capacity = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        self.core.patch_node_status(
            self.node,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test kubelet",
                         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp},
                    ],
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "nodeInfo": {"kubeletVersion": "v1.35.4", "architecture": "amd64", "operatingSystem": "linux",
                                 "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "test",
                                 "containerRuntimeVersion": "local://", "kubeProxyVersion": ""},
                }
            },
        )  # fmt: skip
        lease = {
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": 40,
                "renewTime": datetime.now(UTC).isoformat(),
            },
        }
        try:
            self.coordination.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": lease["spec"]})
        except ApiException as error:
            if error.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", lease)

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        last_beat = time.monotonic()
        while not self._stop.is_set():
            try:
                if time.monotonic() - last_beat > 5:
                    last_beat = time.monotonic()
                    self._heartbeat()
            except Exception as error:
                print(f"test kubelet heartbeat: {error!r}"[:500], file=sys.stderr)
            try:
                self._sync()
            except Exception as error:  # keep playing kubelet; the test sees the effects
                print(f"test kubelet: {error!r} {getattr(error, 'body', '')}"[:2000], file=sys.stderr)
            self._stop.wait(0.25)

    def _sync(self) -> None:
        listed = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        seen = set()
        for pod in listed:
            key = (pod.metadata.namespace, pod.metadata.name)
            seen.add(key)
            if pod.metadata.deletion_timestamp is not None:
                self._delete(key, pod)
            elif key in self.pods:
                self._check_exit(key)
            elif key not in self.finished and pod.status.phase == "Pending" and self._runs(pod) and not self._held(pod):
                self._run(pod)
        for key in list(self.pods):
            if key not in seen:
                _terminate(self.pods.pop(key).process, 5)

    def _runs(self, pod: Any) -> bool:
        return self.only_label is None or self.only_label in (pod.metadata.labels or {})

    def _held(self, pod: Any) -> bool:
        return (pod.metadata.labels or {}).get("datagen.dev/component") in self.held

    def _delete(self, key: tuple[str, str], pod: Any) -> None:
        if key in self.finished and key not in self.pods:
            return  # already terminal: the API server removes it (once the Job controller dropped its finalizer)
        local = self.pods.pop(key, None)
        if local is not None:
            self._draining.append(local)
        self.finished.add(key)
        if local is None and not self._runs(pod):
            # Not this kubelet's to run (only_label): the test that runs it also ends it.
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)
            return
        grace = pod.metadata.deletion_grace_period_seconds
        if grace is None:
            grace = pod.spec.termination_grace_period_seconds
        grace_s = float(30 if grace is None else grace)

        def stop_then_remove() -> None:
            if local is None:
                # Deleted before its container started: a kubelet reports the pod Failed.
                state = {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown", "startedAt": now(),
                                        "finishedAt": now(), "message": "deleted before the container started"}}  # fmt: skip
                phase = "Failed"
            else:
                _terminate(local.process, grace_s)  # SIGTERM: the worker drains and syncs its files
                exit_code = _exit_code(local.process.returncode)
                self.history.append((key[0], key[1], exit_code))
                state = {"terminated": self._terminated(local, exit_code)}
                phase = "Succeeded" if exit_code == 0 else "Failed"
            # The terminal phase before the final delete, as a kubelet does: a Job's pod keeps its tracking
            # finalizer (and the pod stays) until the Job controller has counted a terminal phase.
            self._write_status(pod, phase, state, ready=False)
            with contextlib.suppress(ApiException):
                self.core.delete_namespaced_pod(key[1], key[0], grace_period_seconds=0)

        threading.Thread(target=stop_then_remove, daemon=True).start()

    # --- one pod --------------------------------------------------------------------------------

    def _run(self, pod: Any) -> None:
        namespace, name = pod.metadata.namespace, pod.metadata.name
        (container,) = pod.spec.containers
        workdir = self.workdir / namespace / name
        workdir.mkdir(parents=True, exist_ok=True)
        termination_log = workdir / "termination-log"
        paths = {container.termination_message_path or "/dev/termination-log": str(termination_log)}
        paths.update(host_path_mounts(self.api.sanitize_for_serialization(pod), self.node_paths))
        volumes = {v.name: v for v in pod.spec.volumes or []}
        for mount in container.volume_mounts or []:
            volume = volumes.get(mount.name)
            if volume is not None and volume.config_map is not None:
                target = workdir / "configmaps" / mount.name
                target.mkdir(parents=True, exist_ok=True)
                data = self.core.read_namespaced_config_map(volume.config_map.name, namespace).data or {}
                for item in volume.config_map.items or [client.V1KeyToPath(key=k, path=k) for k in data]:
                    (target / item.path).write_text(data.get(item.key, ""))
                paths[mount.mount_path] = str(target)
            elif volume is not None and volume.empty_dir is not None:
                target = workdir / "emptydirs" / mount.name
                target.mkdir(parents=True, exist_ok=True)
                paths[mount.mount_path] = str(target)
            elif volume is not None and volume.persistent_volume_claim is not None:
                # a claim bound to a hostPath PersistentVolume (the test control plane has no provisioner)
                claim = self.core.read_namespaced_persistent_volume_claim(
                    volume.persistent_volume_claim.claim_name, namespace
                )
                host = self.core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path
                local = map_path(host, self.node_paths)
                paths[mount.mount_path] = posixpath.join(local, mount.sub_path) if mount.sub_path else local
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "PYTHONUNBUFFERED": "1"}
        # PYTHONPATH: the pods run the code under test (a worktree's), as the in-process operator does.
        for key in (
            "XDG_CACHE_HOME",
            "DATAGEN_TOKENIZER_CACHE",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "PYTHONPATH",
        ):
            if key in os.environ:
                env[key] = os.environ[key]
        for var in container.env or []:
            env[var.name] = map_path(self._env_value(pod, var, env), paths)  # e.g. HOME on an emptyDir
        if pod.spec.automount_service_account_token and pod.spec.service_account_name:
            env["KUBECONFIG"] = str(
                self.cluster.kubeconfig_for_service_account(
                    namespace, pod.spec.service_account_name, create=False, expiration_seconds=self.token_seconds
                )
            )
        argv = [_expand(arg, env) for arg in [*(container.command or []), *(container.args or [])]]
        argv = [map_path(arg, paths) for arg in argv]
        if argv and argv[0] == "datagen":
            argv[0] = DATAGEN
        log_path = workdir / "container.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
            )
        started = now()
        key = (namespace, name)
        self.started.append(key)
        self.pods[key] = LocalPod(
            name, namespace, process, workdir, termination_log, log_path,
            container.termination_message_policy == "FallbackToLogsOnError", started,
        )  # fmt: skip
        self._write_status(
            pod,
            "Running",
            {"running": {"startedAt": started}},
            ready=True,
        )

    def _env_value(self, pod: Any, var: Any, env: dict[str, str]) -> str:
        if var.value is not None:
            return _expand(var.value, env)
        ref = var.value_from.field_ref if var.value_from else None
        if ref is None:
            raise RuntimeError(f"test kubelet cannot resolve env {var.name} (secrets are not read here)")
        path = ref.field_path
        if path == "metadata.namespace":
            return str(pod.metadata.namespace)
        if path == "metadata.name":
            return str(pod.metadata.name)
        match = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
        if match:
            source = pod.metadata.annotations if match[1] == "annotations" else pod.metadata.labels
            return str((source or {}).get(match[2], ""))
        raise RuntimeError(f"test kubelet cannot resolve fieldRef {path}")

    def _check_exit(self, key: tuple[str, str]) -> None:
        local = self.pods[key]
        code = local.process.poll()
        if code is None:
            return
        del self.pods[key]
        self.finished.add(key)
        exit_code = _exit_code(code)
        self.history.append((key[0], key[1], exit_code))
        try:
            pod = self.core.read_namespaced_pod(key[1], key[0])
        except ApiException:
            return
        state = {"terminated": self._terminated(local, exit_code)}
        self._write_status(pod, "Succeeded" if exit_code == 0 else "Failed", state, ready=False)

    def _terminated(self, local: LocalPod, exit_code: int) -> dict[str, Any]:
        """The container's terminated state: its exit code and termination message (or its log's tail, for
        FallbackToLogsOnError after a failure)."""
        message = local.termination_log.read_text(errors="replace") if local.termination_log.exists() else ""
        if not message and exit_code and local.fallback_to_logs:
            message = "\n".join(local.log_path.read_text(errors="replace").splitlines()[-20:])[-2048:]
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                      "startedAt": local.started, "finishedAt": now()}  # fmt: skip
        if message:
            terminated["message"] = message[-4096:]
        return terminated

    def _write_status(self, pod: Any, phase: str, state: dict[str, Any], *, ready: bool) -> None:
        stamp = now()
        (container,) = pod.spec.containers
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": stamp},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": stamp},
        ]
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": stamp,
            "conditions": conditions,
            "containerStatuses": [
                {"name": container.name, "image": container.image, "imageID": "", "ready": ready,
                 "restartCount": 0, "started": phase == "Running", "state": state},
            ],
        }  # fmt: skip
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    # --- test hooks -----------------------------------------------------------------------------

    def running(self, namespace: str, prefix: str) -> list[LocalPod]:
        return [p for (ns, name), p in list(self.pods.items()) if ns == namespace and name.startswith(prefix)]

    def kill(self, local: LocalPod) -> None:
        """A crash: SIGKILL, no drain (the kubelet reports exit 137)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(local.process.pid, signal.SIGKILL)


def _expand(text: str, env: dict[str, str]) -> str:
    return VAR.sub(lambda match: env.get(match[1], match[0]), text)


def host_path_mounts(pod: dict[str, Any], node_paths: dict[str, str]) -> dict[str, str]:
    """{mountPath: local folder} for the hostPath volumes the container of `pod` (a plain object, as the
    API serves it) mounts, each hostPath mapped through `node_paths`."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    (container,) = pod["spec"]["containers"]
    mounts = {}
    for mount in container.get("volumeMounts") or []:
        host_path = volumes.get(mount["name"], {}).get("hostPath")
        if host_path is not None:
            local = map_path(host_path["path"], node_paths)
            mounts[mount["mountPath"]] = posixpath.join(local, mount["subPath"]) if mount.get("subPath") else local
    return mounts


def map_path(arg: str, paths: dict[str, str]) -> str:
    """`arg` with its longest matching path prefix (a key of `paths`) replaced by that prefix's value."""
    for mount in sorted(paths, key=len, reverse=True):
        if arg == mount or arg.startswith(mount.rstrip("/") + "/"):
            return paths[mount] + arg[len(mount) :]
    return arg


def _exit_code(returncode: int) -> int:
    """A process's exit as a kubelet reports it: killed by signal N is 128+N."""
    return returncode if returncode >= 0 else 128 - returncode


def _terminate(process: subprocess.Popen[bytes], grace_s: float) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
