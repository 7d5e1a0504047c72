"""A server over several nodes (server.nodes > 1) on the real control plane with the real LeaderWorkerSet
controller: the operator makes one LWS group per replica on the kwok GPU nodes; the simulator on loopback
answers for each group's leader (DATAGEN_TEST_SERVER_URLS), as it does for single-node servers."""

from __future__ import annotations

from pathlib import Path

from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.lws import LWS_API_VERSION, LWS_NAME_LABEL
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name


def group_pods(runs: Runs, name: str) -> dict[str, str]:
    """Pod name -> uid of the run's group (leader and workers)."""
    pods = runs.core.list_namespaced_pod(runs.namespace, label_selector=f"{LWS_NAME_LABEL}={name}-server").items
    return {p.metadata.name: p.metadata.uid for p in pods if p.metadata.deletion_timestamp is None}


def test_a_two_node_server_runs_to_succeeded_and_a_lost_worker_recreates_its_group(
    lws_controller: Cluster,
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    name = new_name("group")
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"server.nodes": 2}))

        ready = runs.wait(name, "ServerReady", "True", "Ready", timeout=120)
        assert "1/1 replica ready" in ready["message"]
        lws = lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet").get(
            name=f"{name}-server", namespace=runs.namespace
        )
        assert lws.spec.leaderWorkerTemplate.size == 2 and lws.metadata.ownerReferences[0].kind == "DataGenRun"
        first = runs.wait_for(
            "the group's two pods", lambda: (pods := group_pods(runs, name)) and len(pods) == 2 and pods
        )
        assert sorted(first) == [f"{name}-server-0", f"{name}-server-0-1"]
        # No StatefulSet of the operator's own and no headless Service but LWS's (it publishes not-ready leaders).
        assert (
            runs.apps.list_namespaced_stateful_set(runs.namespace, label_selector="datagen.dev/component=server").items
            == []
        )
        headless = runs.core.read_namespaced_service(f"{name}-server", runs.namespace)
        assert headless.spec.publish_not_ready_addresses is True
        runs.wait(name, "CanaryPassed", "True", "Passed", timeout=120)
        runs.wait(name, "Progressing", "True", "Running", timeout=60)

        # A worker rank is lost: LWS recreates the whole group (a new leader too), the run waits and resumes.
        runs.core.delete_namespaced_pod(f"{name}-server-0-1", runs.namespace)

        def new_group() -> dict[str, str] | None:
            pods = group_pods(runs, name)
            return pods if len(pods) == 2 and not set(pods.values()) & set(first.values()) else None

        recreated = runs.wait_for("the group recreated", new_group, timeout=90)
        assert sorted(recreated) == sorted(first)  # the same names, new pods

        done = runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
    assert "24/24 prompts" in done["message"]
    status = runs.get(name)["status"]
    assert status["progress"]["promptsDone"] == 24
    # The end of the run releases the GPUs: no group left.
    assert (
        lws_controller.resource(LWS_API_VERSION, "LeaderWorkerSet")
        .get(name=f"{name}-server", namespace=runs.namespace)
        .spec.replicas
        == 0
    )


def test_a_group_that_cannot_be_placed_shows_the_schedulers_words(
    lws_controller: Cluster, runs: Runs, operator: OperatorFactory, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("big-group")
    operator(["http://127.0.0.1:9"])
    # Three 8-GPU pods, two GPU nodes: the third pod of the group finds no node.
    runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"server.nodes": 3}))
    condition = runs.wait(name, "ServerReady", "False", "Unschedulable", timeout=90)
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    assert "of a group of 3; 2 of its pods placed and holding their GPUs meanwhile" in condition["message"]
    assert runs.job(f"{name}-canary") is None and runs.job(f"{name}-workers") is None
    runs.delete(name)
