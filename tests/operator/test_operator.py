"""The operator end to end on a real API server, scheduler, controller-manager and kwok, as its own
ServiceAccount. The test plays kubelet only where kwok does not (see kubelet.py); the simulator on loopback
answers for the server pods through the test-only endpoint override (DATAGEN_TEST_SERVER_URLS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from datagen_operator.control.server import NEVER_FITS_HINT
from datagen_operator.output.layout import OutputLayout
from tests.harness.controlplane import GPU_TOLERATION
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim, start_sims
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name


def parquet_servers(output: Path) -> list[str]:
    """The `server` column of every record: which replica answered."""
    import pyarrow.parquet as pq

    return [
        s
        for path in sorted(output.rglob("*.parquet"))
        for s in pq.read_table(path, columns=["server"])["server"].to_pylist()
    ]


def test_run_story_apply_to_succeeded_with_a_crash_and_an_operator_restart(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("story")
    with start_sims([(*KIMI, *SLOW), (*KIMI, *SLOW)], tokenizer_dir=standin_tokenizer) as sims:
        urls = [sim.url for sim in sims]  # two data-parallel replicas, one simulator each
        handle = operator(urls)
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"server.replicas": 2}))

        # The inputs are checked by a CPU pod before any GPU is asked for.
        inputs = runs.wait(name, "InputsVerified", "True", "Passed", timeout=60)
        assert "24 prompts" in inputs["message"] and "is new" in inputs["message"]

        # The server pod lands on a kwok GPU node; the operator asks the server itself before it trusts it.
        ready = runs.wait(name, "ServerReady", "True", "Ready")
        assert "/health_generate" in ready["message"]
        sts = runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace)
        container = sts.spec.template.spec.containers[0]
        assert container.resources.limits["nvidia.com/gpu"] == "8"
        assert "--reasoning-parser" in container.command
        assert "2/2 replicas ready" in ready["message"]
        pods = runs.core.list_namespaced_pod(runs.namespace, label_selector="datagen.dev/component=server").items
        assert sorted(p.metadata.name for p in pods) == [f"{name}-server-0", f"{name}-server-1"]
        services = {s.metadata.name for s in runs.core.list_namespaced_service(runs.namespace).items}
        assert {f"{name}-server", f"{name}-server-0", f"{name}-server-1"} <= services
        assert runs.wait(name, "ParsersVerified", "True", "Verified")["message"].startswith("SGLang")
        assert runs.wait(name, "CanaryPassed", "True", "Passed", timeout=120)
        runs.wait(name, "Progressing", "True", "Running", timeout=60)
        log = runs.cluster.logs_dir / "kubectl-get-dgr.log"
        runs.kubectl_get_wide(log)

        # A worker crashes (SIGKILL, exit 137): the Job retries its index and the new pod resumes it.
        crashed = runs.wait_for("a running worker", lambda: kubelet.running(runs.namespace, f"{name}-workers-"))[0]
        kubelet.kill(crashed)
        runs.wait_for("the crash recorded", lambda: any(code == 137 for _, _, code in kubelet.history))

        # The operator restarts mid-run: it re-adopts its children by name and duplicates nothing.
        handle.stop()
        jobs_before = {j.metadata.name: j.metadata.uid for j in runs.batch.list_namespaced_job(runs.namespace).items}
        operator(urls)

        done = runs.wait(name, "Succeeded", "True", "Completed", timeout=180)
        runs.kubectl_get_wide(log)
        jobs_after = {j.metadata.name: j.metadata.uid for j in runs.batch.list_namespaced_job(runs.namespace).items}
        assert {k: v for k, v in jobs_after.items() if k in jobs_before} == jobs_before
        assert set(jobs_after) == {f"{name}-preflight", f"{name}-canary", f"{name}-workers", f"{name}-verify"}

    status = runs.get(name)["status"]
    assert status["progress"]["promptsDone"] == status["progress"]["promptsTotal"] == 24
    assert "24/24 prompts" in done["message"]
    assert runs.condition(name, "DataFaithful")["status"] == "True"  # type: ignore[index]
    manifest = json.loads((data_dir / "out" / name / "manifest.json").read_text())
    assert status["fingerprint"] == manifest["fingerprint_sha256"], "the data fingerprint reaches the status"
    servers = parquet_servers(data_dir / "out" / name)
    assert len(servers) == 24 and set(servers) == set(urls), "workers spread over both replicas"
    # the end of the run releases the GPUs
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0
    workers = runs.job(f"{name}-workers")
    assert workers is not None and workers.status.failed >= 1 and workers.status.succeeded == 2
    reasons = {e.reason for e in runs.events(name)}
    assert {
        "InputsVerifiedPassed", "ServerReadyReady", "ParsersVerifiedVerified", "CanaryPassedPassed", "SucceededCompleted"
    } <= reasons  # fmt: skip
    wide = log.read_text()
    print(wide)
    assert "True" in wide.splitlines()[-2] and "24/24 prompts" in wide


def test_not_enough_gpus_shows_the_schedulers_words_and_warns_only_when_waiting_cannot_help(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    """16 GPUs on 8-GPU nodes never fit: a Warning, and what to change. 8 GPUs while every node's are in use is
    the normal wait of a shared cluster: a Normal event, and the run moves on once the GPUs are free."""
    big, busy = new_name("big"), new_name("busy")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(big, data_dir, standin_tokenizer, **{"server.gpus": 16, "server.tensorParallel": 16}))
    condition = runs.wait(big, "ServerReady", "False", "Unschedulable", timeout=60)
    assert "Insufficient nvidia.com/gpu" in condition["message"] and NEVER_FITS_HINT in condition["message"]
    assert runs.job(f"{big}-canary") is None and runs.job(f"{big}-workers") is None

    fillers = [f"{busy}-filler-{i}" for i in range(2)]  # another team's pods, holding every node's 8 GPUs
    for filler in fillers:
        container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
        spec = {"containers": [container], "tolerations": [GPU_TOLERATION]}
        runs.core.create_namespaced_pod(runs.namespace, {"metadata": {"name": filler}, "spec": spec})
    runs.wait_for("the fillers on the GPU nodes", lambda: all(runs.pod_ip(f) for f in fillers))
    runs.create(cluster_run(busy, data_dir, standin_tokenizer))
    waiting = runs.wait(busy, "ServerReady", "False", "Unschedulable", timeout=60)
    assert "No preemption victims found" in waiting["message"] and NEVER_FITS_HINT not in waiting["message"]
    for filler in fillers:
        runs.core.delete_namespaced_pod(filler, runs.namespace, grace_period_seconds=0)
    runs.wait(busy, "ServerReady", "False", "Loading", timeout=60)

    def unschedulable_events(name: str) -> list[str]:
        return [e.type for e in runs.events(name) if e.reason == "ServerReadyUnschedulable"]

    assert unschedulable_events(big) == ["Warning"] and unschedulable_events(busy) == ["Normal"]
    assert not [e.reason for e in runs.events(busy) if e.type == "Warning"]


def test_crash_looping_server_shows_why(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("oom")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(name, data_dir, standin_tokenizer))
    pod = f"{name}-server-0"
    runs.wait_for("kwok to run the server pod", lambda: runs.pod_ip(pod))
    # Playing the kubelet of a server that dies while loading (kwok has no crashes).
    stamp = "2026-11-29T09:00:00Z"
    runs.core.patch_namespaced_pod_status(
        pod,
        runs.namespace,
        {
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": stamp}],
                "containerStatuses": [
                    {
                        "name": "server", "image": "lmsysorg/sglang:v0.5.23", "imageID": "", "ready": False,
                        "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": stamp,
                                                     "finishedAt": stamp, "message": "torch.OutOfMemoryError: CUDA out of memory"}},
                    }
                ],
            }
        },
    )  # fmt: skip
    condition = runs.wait(name, "ServerReady", "False", "CrashLoop", timeout=30)
    assert "CUDA out of memory" in condition["message"] and "restarted 3 times" in condition["message"]
    assert runs.wait(name, "Succeeded", "Unknown", "Running")


def test_an_empty_dataset_halts_before_any_server_pod(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("empty")
    operator(["http://127.0.0.1:9"])
    (data_dir / "empty.jsonl").write_text("\n")
    runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"dataset.path": "empty.jsonl"}))
    halted = runs.wait(name, "Succeeded", "False", "PreflightFailed", timeout=90)
    assert "the dataset is empty" in halted["message"]
    assert runs.condition(name, "InputsVerified")["reason"] == "DatasetUnusable"  # type: ignore[index]
    assert runs.condition(name, "ServerReady")["reason"] == "NotStarted"  # type: ignore[index]
    with pytest.raises(ApiException):
        runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace)
    assert runs.job(f"{name}-canary") is None and runs.job(f"{name}-workers") is None


def test_parser_mismatch_halts_before_any_bulk_work(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("kimi-tags")
    with start_sim(
        "--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", tokenizer_dir=standin_tokenizer
    ) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        verdict = runs.wait(name, "ParsersVerified", "False", "Mismatch", timeout=60)
        assert "kimi_k2" in verdict["message"]
        halted = runs.wait(name, "Succeeded", "False", "ParsersMismatch")
        assert halted["message"] == verdict["message"]
    assert runs.job(f"{name}-canary") is None and runs.job(f"{name}-workers") is None
    runs.wait_for(
        "the GPUs released",
        lambda: runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0,
    )
    # Nothing but what the preflight wrote (the dataset pin, its rendered prompts): no record, no manifest; the
    # preflight's lease is given back by the halt's release Job.
    output = data_dir / "out" / name
    runs.wait_for("the lease given back", lambda: not OutputLayout(output).lease.exists(), 60)
    layout = OutputLayout(output)
    assert set(output.iterdir()) == {layout.dataset_pin, layout.dataset_line_hashes, layout.rendered}


def test_suspend_resume_refused_change_and_deletion_keeping_the_data(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("pause")
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        runs.wait_for("records written", lambda: any((data_dir / "out" / name).rglob("*.jsonl*")))

        # A data-affecting change after bulk records exist is refused; the run keeps its applied spec.
        runs.patch_spec(name, {"model": {"path": "/models/other"}})
        refused = runs.wait(name, "SpecApplied", "False", "DataFieldsFrozen")
        assert "spec.model.path" in refused["message"]
        runs.patch_spec(name, {"model": {"path": "/models/standin"}})
        runs.wait(name, "SpecApplied", "True", "Applied")

        runs.patch_spec(name, {"suspend": True})
        runs.wait(name, "ServerReady", "False", "Suspended")
        runs.wait_for(
            "the server scaled to zero and the workers suspended",
            lambda: (
                runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0
                and runs.job(f"{name}-workers").spec.suspend
            ),
        )
        runs.wait_for("the worker processes stopped", lambda: not kubelet.running(runs.namespace, f"{name}-workers-"))
        runs.patch_spec(name, {"suspend": False})
        runs.wait(name, "Progressing", "True", "Running", timeout=60)
        runs.wait_for("workers running again", lambda: kubelet.running(runs.namespace, f"{name}-workers-"), 60)

        # Deletion mid-run: workers stop first, then the server; the output stays on its volume.
        runs.delete(name)

        def gone() -> bool:
            try:
                runs.get(name)
            except ApiException as error:
                return error.status == 404
            return False

        runs.wait_for("the run deleted (finalizer done)", gone, 90)
    assert runs.job(f"{name}-workers") is None
    assert any((data_dir / "out" / name).rglob("*")), "the output must survive the run's deletion"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"server": {"gpus": 8, "tensorParallel": 3}}, "spec.server.tensorParallel"),
        ({"server": {"reasoningParser": "kimi"}}, "spec.server.reasoningParser"),
        ({"server": {"image": "lmsysorg/sglang:latest"}}, "spec.server.image"),
        ({"generation": {"sampling": {"max_new_tokens": 0}}}, "spec.generation.sampling.max_new_tokens"),
        # a flag the operator manages: refused by a CEL rule on each item, as `datagen validate` refuses it
        ({"server": {"extraArgs": ["--watchdog-timeout", "600", "--tp-size", "4"]}}, "spec.server.extraArgs[2]"),
    ],
)
def test_invalid_manifests_are_refused_by_the_api_server(
    runs: Runs, data_dir: Path, standin_tokenizer: Path, change: dict, field: str
) -> None:
    manifest = cluster_run(new_name("bad"), data_dir, standin_tokenizer, **change)
    with pytest.raises(ApiException) as refused:
        runs.create(manifest)
    assert refused.value.status == 422
    assert field in refused.value.body
