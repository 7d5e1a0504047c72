"""server.external.service on the real control plane: the run creates no server (no StatefulSet, LeaderWorkerSet,
server pod or server Service), sends its canary and workers to the Service's cluster DNS name, says the server is
external, and leaves it running. The Service's name resolves to the loopback simulator, as cluster DNS and
kube-proxy would route it: in the operator's process (its probes) and in the test kubelet's pods (their args)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from datagen_operator.k8s.object_meta import SERVER_URLS
from tests.harness.kubelet import PodRunner
from tests.harness.sim import health_status, start_sim
from tests.manifests import DELETE, cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name

SERVICE = "sglang"


def route_to_loopback(monkeypatch: pytest.MonkeyPatch, kubelet: PodRunner, host: str) -> None:
    """`host` resolves to 127.0.0.1 in this process (the in-process operator) and in the kubelet's pods."""
    original = socket.getaddrinfo

    def resolve(name: Any, *args: Any, **kwargs: Any) -> Any:
        return original("127.0.0.1" if name == host else name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setitem(kubelet.service_hosts, host, "127.0.0.1")


def test_a_run_on_an_external_service_creates_no_server_and_sends_to_the_service(
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = new_name("external")
    host = f"{SERVICE}.{runs.namespace}.svc"
    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        url = f"http://{host}:{sim.port}"
        # The Service an OME InferenceService or a KServe LLMInferenceService would make in front of its SGLang.
        service = client.V1Service(
            metadata=client.V1ObjectMeta(name=SERVICE),
            spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=sim.port)]),
        )
        runs.core.create_namespaced_service(runs.namespace, service)
        route_to_loopback(monkeypatch, kubelet, host)
        operator([])  # no test override: the run's URL is the Service's own
        external = {"service": {"name": SERVICE, "port": sim.port}}
        runs.create(
            cluster_run(
                name, data_dir, standin_tokenizer, **{"server.external": external, "server.tolerations": DELETE}
            )
        )

        done = runs.wait(name, "Succeeded", "True", "Completed", timeout=180)
        assert "24/24 prompts" in done["message"]
        assert sim.running and health_status(sim.url) == 200, "the run never stops a server it does not own"

    # No server of the run's: counted, not assumed.
    label = "datagen.dev/component=server"
    assert runs.core.list_namespaced_pod(runs.namespace, label_selector=label).items == []
    assert runs.apps.list_namespaced_stateful_set(runs.namespace).items == []
    assert runs.apps.list_namespaced_deployment(runs.namespace).items == []
    custom = client.CustomObjectsApi(runs.cluster.api_client())
    try:
        groups = custom.list_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", runs.namespace, "leaderworkersets"
        )
        assert groups["items"] == []
    except client.exceptions.ApiException as error:
        assert error.status == 404  # LWS not installed here: none can exist
    services = [s.metadata.name for s in runs.core.list_namespaced_service(runs.namespace).items]
    assert services == [SERVICE], services

    # The canary and the workers were given the Service's cluster DNS name, nothing else.
    for job in (f"{name}-canary", f"{name}-workers"):
        made = runs.job(job)
        assert made is not None and made.metadata.annotations[SERVER_URLS] == url
        args = " ".join(
            [
                *(made.spec.template.spec.containers[0].command or []),
                *(made.spec.template.spec.containers[0].args or []),
            ]
        )
        assert f"--server {url}" in args, args

    # The conditions say the server is external, with its URL; at the end it is left running.
    said = {e.reason: e.message for e in runs.events(name)}
    assert said.get("ServerReadyExternalServerReady") == (
        f"ServerReady=True (ExternalServerReady): external server {url} answers /health_generate (not the run's: it never starts, scales or stops it)"
    ), said
    assert runs.get(name)["status"]["server"]["external"] is True
    ready = runs.condition(name, "ServerReady")
    assert ready is not None and ready["reason"] == "Released"
    assert "the external server is no longer used and keeps running" in ready["message"]
    assert runs.condition(name, "ParsersVerified")["status"] == "True"  # type: ignore[index]
