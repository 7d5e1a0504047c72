"""What a user sees, counted: server pod creations per run, the status writes of a run, refusals named on the
run, ServerReady after a halt, and who the events come from. The story tests check that runs end well; these
check how often things happen on the way (each server pod creation is a model load on GPUs)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.k8s.kube import Kube
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name

PROGRESS_WRITE_S = 2.0
"""The operator fixture's DATAGEN_PROGRESS_WRITE_SECONDS."""
SLOW = ("--sim-speed", "gpu", "--sim-tokens-per-s", "25", "--sim-ttft-s", "0.05")
"""About 4 s per request: long enough to change a live field on a loaded server and to see progress writes."""


def server_pod_events(runs: Runs, name: str, reason: str) -> int:
    """How often the StatefulSet controller did `reason` (SuccessfulCreate: a server pod, i.e. a model load)."""
    return sum(e.count or 1 for e in runs.events(f"{name}-server") if e.reason == reason)


def server_pod(runs: Runs, name: str) -> Any:
    return runs.core.read_namespaced_pod(f"{name}-server-0", runs.namespace)


@pytest.fixture
def status_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, str, dict[str, Any]]]:
    """(monotonic time, run, status) of every status write the in-process operator makes."""
    writes: list[tuple[float, str, dict[str, Any]]] = []
    original = Kube.patch_status

    async def recording(self: Kube, namespace: str, name: str, status: Any) -> None:
        writes.append((time.monotonic(), name, dict(status)))
        await original(self, namespace, name, status)

    monkeypatch.setattr(Kube, "patch_status", recording)
    return writes


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """resolve_model calls made in the in-process operator's passes, and those passes (deletions aside)."""
    import sys
    import traceback

    from datagen_operator.api import resolve
    from datagen_operator.k8s.reconcile import Reconciler

    counts = {"resolves": 0, "passes": 0}
    original = resolve.resolve_model

    def counting(spec: Any) -> Any:
        # Only a pass's own resolutions: the storage check on create/update parses the spec by itself.
        if any(frame.name == "run_pass" for frame in traceback.extract_stack()):
            counts["resolves"] += 1
        return original(spec)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("datagen_operator") and (
            getattr(module, "resolve_model", None) is original
        ):
            monkeypatch.setattr(module, "resolve_model", counting)
    run_pass = Reconciler.run_pass

    async def counted(self: Reconciler, body: Any) -> Any:
        if not body["metadata"].get("deletionTimestamp"):
            counts["passes"] += 1
        return await run_pass(self, body)

    monkeypatch.setattr(Reconciler, "run_pass", counted)
    return counts


def urgent_part(status: dict[str, Any]) -> Any:
    """What a user would call news: any field but numbers and messages (a token rate, a check's rate)."""
    rest = {k: v for k, v in status.items() if k not in ("progress", "conditions", "checks")}
    conditions = [
        (c["type"], c["status"], c["reason"], c.get("observedGeneration")) for c in status.get("conditions") or []
    ]
    checks = [(c["name"], c["passed"]) for c in status.get("checks") or []]
    return rest, conditions, checks


def test_one_server_pod_per_run_through_live_changes_verification_and_release(
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    status_writes: list[tuple[float, str, dict[str, Any]]],
    resolutions: dict[str, int],
) -> None:
    name = new_name("counted")
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"clients.shards": 3, "clients.concurrency": 2}))
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        loaded = server_pod(runs, name)
        sts_before = runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace)
        managers = {(f.manager, f.operation) for f in sts_before.metadata.managed_fields}
        assert ("datagen-operator", "Apply") in managers, managers  # applied server-side, by its own name

        # Live fields on a loaded server: the operator's own budget and the placement of the NEXT server start.
        toleration = {"key": "datagen.dev/test-only", "operator": "Exists", "effect": "NoSchedule"}
        tolerations = [*cluster_run(name, data_dir, standin_tokenizer)["spec"]["server"]["tolerations"], toleration]
        changed = runs.patch_spec(name, {"server": {"startupTimeout": "20m", "tolerations": tolerations}})
        generation = changed["metadata"]["generation"]
        runs.wait_for(
            "the change observed",
            lambda: runs.get(name)["status"].get("observedGeneration") == generation,
        )
        runs.wait_passes(name, 3)  # a few more passes to give a wrong patch its chance
        assert server_pod(runs, name).metadata.uid == loaded.metadata.uid, "a live field restarted the server"
        sts = runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace)
        assert sts.spec.template == sts_before.spec.template, "the running template waits for the next start"

        done = runs.wait(name, "Succeeded", "True", "Completed", timeout=180)
        assert "24/24 prompts" in done["message"]
        released = runs.wait(name, "ServerReady", "False", "Released")
        assert "GPUs released" in released["message"]
        runs.wait_for(
            "the server pod gone",
            lambda: (
                not runs.core.list_namespaced_pod(runs.namespace, label_selector="datagen.dev/component=server").items
            ),
        )

    # One model load per run: created once, deleted once (the release), never scaled back up for verification.
    assert server_pod_events(runs, name, "SuccessfulCreate") == 1
    assert server_pod_events(runs, name, "SuccessfulDelete") == 1
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0

    # The model is resolved once per pass (while its spec is validated) and handed down: not per builder.
    assert resolutions["passes"] > 10 and resolutions["resolves"] == resolutions["passes"], resolutions

    # Status writes: news goes out at once; numbers-only writes are spaced by progress_write_s.
    ours = [(t, s) for t, run, s in status_writes if run == name]
    progress_only = [
        later - earlier
        for (earlier, before), (later, after) in itertools.pairwise(ours)
        if urgent_part(before) == urgent_part(after)
    ]
    summary = (
        f"{name}: {len(ours)} status writes in {ours[-1][0] - ours[0][0]:.1f} s, {len(progress_only)} progress-only"
    )
    gaps = ", ".join(f"{gap:.2f}" for gap in sorted(progress_only))
    with (runs.cluster.logs_dir / "status-writes.log").open("a") as log:  # stdout belongs to KopfRunner here
        log.write(f"{summary}; progress-only gaps (s): {gaps}\n")
    assert progress_only, "a 3-shard run of ~15 s makes progress-only writes"
    assert min(progress_only) >= PROGRESS_WRITE_S - 0.05
    duration = ours[-1][0] - ours[0][0]
    assert len(progress_only) <= duration / PROGRESS_WRITE_S + 1

    # Events come from the operator under its own name, not from the framework.
    events = runs.events(name)
    assert events and {(e.source.component, e.reporting_component) for e in events} == {
        ("datagen-operator", "datagen-operator")
    }


def test_a_halted_run_reads_server_ready_false_with_one_server_pod(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("halted")
    with start_sim(
        "--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", tokenizer_dir=standin_tokenizer
    ) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "Succeeded", "False", "ParsersMismatch", timeout=90)
    server = runs.condition(name, "ServerReady")
    assert server is not None and (server["status"], server["reason"]) == ("False", "Released"), server
    runs.wait_for(
        "the GPUs released",
        lambda: runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0,
    )
    runs.wait_passes(name, 3)  # passes over a halted run must not bring the server back
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0
    assert server_pod_events(runs, name, "SuccessfulCreate") == 1
    assert runs.get(name)["status"]["server"]["replicas"] == 0


def test_a_server_whose_parsers_cannot_be_read_halts_after_bounded_probes(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS

    name = new_name("unread")
    # Ready by its health checks, but every chat request (the parser probe's) fails with a 500.
    with start_sim(*KIMI, "--sim-fault-5xx-rate", "1", tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        halted = runs.wait(name, "Succeeded", "False", "ProbeFailed", timeout=120)
    assert f"in {PARSER_PROBE_ATTEMPTS} attempts" in halted["message"] and "500" in halted["message"]
    parsers = runs.condition(name, "ParsersVerified")
    assert parsers is not None and (parsers["status"], parsers["reason"]) == ("False", "ProbeFailed"), parsers
    runs.wait_for(
        "the GPUs released",
        lambda: runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0,
    )
    runs.wait_passes(name, 3)  # the halt stands: no canary, no server again
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0
    assert server_pod_events(runs, name, "SuccessfulCreate") == 1
    jobs = {j.metadata.name for j in runs.batch.list_namespaced_job(runs.namespace).items}
    assert f"{name}-canary" not in jobs and f"{name}-workers" not in jobs, jobs


def quota(runs: Runs, hard: dict[str, str]) -> str:
    """A ResourceQuota with its usage computed. The test control plane runs no quota controller, so the test
    writes the status the controller would (nothing used yet); the API server's admission enforces it."""
    name = new_name("quota")
    runs.core.create_namespaced_resource_quota(runs.namespace, {"metadata": {"name": name}, "spec": {"hard": hard}})
    used = dict.fromkeys(hard, "0")
    runs.core.patch_namespaced_resource_quota_status(name, runs.namespace, {"status": {"hard": hard, "used": used}})
    return name


def warnings(runs: Runs, name: str, reason: str) -> list[Any]:
    return [e for e in runs.events(name) if e.reason == reason and e.type == "Warning"]


def test_a_server_pod_refused_by_a_quota_is_named_on_the_run(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    quota(runs, {"requests.nvidia.com/gpu": "0"})
    name = new_name("no-gpus")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(name, data_dir, standin_tokenizer))
    refused = runs.wait(name, "ServerReady", "False", "Refused", timeout=90)
    # The API server's own words, as the StatefulSet controller got them.
    assert "exceeded quota" in refused["message"] and "requests.nvidia.com/gpu" in refused["message"]
    assert f'pods "{name}-server-0" is forbidden' in refused["message"]
    runs.wait_for("a warning event on the run", lambda: warnings(runs, name, "ServerReadyRefused"))


def test_a_job_refused_by_the_api_server_is_named_on_the_run_and_clears(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    no_jobs = quota(runs, {"count/jobs.batch": "0"})
    name = new_name("no-jobs")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(name, data_dir, standin_tokenizer))
    refused = runs.wait(name, "ChildrenAccepted", "False", "Refused", timeout=30)
    assert f"Job/{name}-preflight" in refused["message"] and "exceeded quota" in refused["message"]
    assert f'jobs.batch "{name}-preflight" is forbidden' in refused["message"]
    runs.wait_for("a warning event on the run", lambda: warnings(runs, name, "ChildrenAcceptedRefused"))

    # The refusal goes away, the run goes on, and says so.
    runs.core.delete_namespaced_resource_quota(no_jobs, runs.namespace)
    runs.wait(name, "ChildrenAccepted", "True", "Accepted", timeout=60)
    runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)


def test_a_new_run_shows_its_status_before_its_children_are_written(
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With many runs applied at once, a run's children queue behind each other's writes: `kubectl get dgr`
    shows the run's first status before them, not seconds after (bench/operator.py measures the time)."""
    writes: list[str] = []

    def recorded(method: str) -> Any:
        original = getattr(Kube, method)

        async def recording(self: Kube, *args: Any, **kwargs: Any) -> Any:
            if method == "patch_status":
                writes.append(f"status of {args[1]}")
            elif method in ("create", "apply"):
                writes.append(f"{args[0]['kind']}/{args[0]['metadata']['name']}")
            else:
                writes.append(f"{args[0]}/{args[2]}")
            return await original(self, *args, **kwargs)

        return recording

    for method in ("create", "apply", "patch", "patch_status", "delete"):
        monkeypatch.setattr(Kube, method, recorded(method))
    name = new_name("first")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(name, data_dir, standin_tokenizer))
    runs.wait_for("the preflight Job", lambda: runs.job(f"{name}-preflight"))
    first_status = writes.index(f"status of {name}")
    # Only the spec in force (its ConfigMap, what the pass decides from) is written before the status.
    assert writes[:first_status] == [f"ConfigMap/{name}-spec"], writes
    assert f"Job/{name}-preflight" in writes[first_status:], writes


def test_a_step_that_crashes_is_retried_not_judged(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    """The model directory is not there yet (its loader Job still copying): the preflight crashes, writes no
    verdict, and its Job runs it again; once the model is there the inputs pass. One crash, no halt."""
    import shutil

    from datagen_operator.api.exit_codes import EXIT_STEP_CRASHED

    model = data_dir.parent / "model-arriving"
    name = new_name("crashed")
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(name, data_dir, model))

    def preflight_exits() -> list[int]:
        return [
            code for ns, pod, code in kubelet.history if ns == runs.namespace and pod.startswith(f"{name}-preflight")
        ]

    runs.wait_for("the preflight's crash", preflight_exits, timeout=60)
    shutil.copytree(standin_tokenizer, model)
    runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)
    assert preflight_exits() == [EXIT_STEP_CRASHED, 0]
    succeeded = runs.condition(name, "Succeeded")
    assert succeeded is None or succeeded["status"] != "False", succeeded
