"""k8s/*_manifests.py, pod_parts.py, pod_paths.py, object_meta.py: the Kubernetes objects of one run, pure builders
from its spec and names."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_OUTPUT_VOLUME,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.api.live_fields import changed_data_fields
from datagen_operator.api.names import export_job_name
from datagen_operator.api.paths import DATASET_MOUNT, OUTPUT_MOUNT, dataset_file
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.engine.health import HEALTH_CHECK_TIMEOUT_S, HEALTH_POLL_S, WATCHDOG_TIMEOUT_S
from datagen_operator.engine.launch import server_argv
from datagen_operator.k8s import (
    job_manifests,
    object_meta,
    pod_parts,
    run_manifests,
    server_hashes,
    server_manifests,
)
from tests.manifests import unit_spec

RUN = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")


SPEC = parse_spec(unit_spec())


def test_server_statefulset_gpus_probes_shm_model_and_placement() -> None:
    sts = server_manifests.server_statefulset(RUN, SPEC, 2)
    assert sts["metadata"]["ownerReferences"] == [RUN.owner_reference()]
    assert sts["spec"]["podManagementPolicy"] == "Parallel" and sts["spec"]["replicas"] == 2
    assert sts["spec"]["serviceName"] == "kimi-server"
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == server_argv(SPEC, host="0.0.0.0")
    assert "--reasoning-parser" in container["command"] and "0.0.0.0" in container["command"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"  # equal when present
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health_generate"
    # server.startupTimeout is the operator's to enforce: it never touches the pod template (a live field)
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 7 * 24 * 3600
    slower = server_manifests.server_statefulset(
        RUN, SPEC.model_copy(update={"server": SPEC.server.model_copy(update={"startup_timeout": 99999})}), 2
    )
    assert slower["spec"]["template"] == sts["spec"]["template"]
    assert "initialDelaySeconds" not in startup
    assert container["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    liveness = container["livenessProbe"]
    assert liveness["httpGet"]["path"] == "/health"
    # SGLang's health call answers 503 itself after its timeout without scheduler output (engine/health.py):
    # every probe waits past that, so the verdict is SGLang's; and the kubelet restarts (a model reload) only
    # a server SGLang's watchdog would have ended.
    for probe in (startup, container["readinessProbe"], liveness):
        assert probe["timeoutSeconds"] > HEALTH_CHECK_TIMEOUT_S + HEALTH_POLL_S
    assert liveness["periodSeconds"] * (liveness["failureThreshold"] - 1) > WATCHDOG_TIMEOUT_S + HEALTH_CHECK_TIMEOUT_S
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mounts = {v["name"]: v for v in container["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models/kimi", "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "gpu-batch"
    assert pod["affinity"] == {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert env["SGLANG_X"]["value"] == "1"


def test_services_one_headless_and_one_per_replica() -> None:
    headless = server_manifests.headless_service(RUN, SPEC)
    assert headless["spec"]["clusterIP"] == "None"
    one = server_manifests.replica_service(RUN, SPEC, 1)
    assert one["metadata"]["name"] == "kimi-server-1"
    assert one["spec"]["selector"] == {"statefulset.kubernetes.io/pod-name": "kimi-server-1"}
    assert server_manifests.server_urls("kimi", "ml", SPEC) == [
        "http://kimi-server-0.ml.svc:30000",
        "http://kimi-server-1.ml.svc:30000",
    ]
    assert server_manifests.server_urls("kimi", "ml", SPEC, ("http://127.0.0.1:1",)) == ["http://127.0.0.1:1"] * 2


def test_workers_job_indexed_with_failure_policy_and_least_privilege() -> None:
    job = job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a", "http://b"], suspend=False)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimitPerIndex"] >= 1
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    ignored = next(r for r in rules if r["action"] == "Ignore" and "onExitCodes" in r)["onExitCodes"]["values"]
    assert set(ignored) == {EXIT_SERVER_UNREACHABLE, EXIT_DRAINED}
    failed = next(r for r in rules if r["action"] == "FailIndex")["onExitCodes"]["values"]
    assert set(failed) == {EXIT_BAD_INPUT, EXIT_FINGERPRINT_MISMATCH, EXIT_OUTPUT_VOLUME}
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "kimi-worker"
    (container,) = pod["containers"]
    args = container["command"]
    assert args[:4] == ["datagen", "worker", "--run", "/etc/datagen/run.yaml"]
    assert args[args.index("--output") + 1] == "/mnt/datagen/output/eagle3/b1"
    assert args[args.index("--dataset") + 1] == "/mnt/datagen/dataset/prompts/b1.jsonl"
    assert args[args.index("--progress-configmap") + 1] == "kimi-shard-$(JOB_COMPLETION_INDEX)"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--server"] == ["http://a", "http://b"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # dataset and output share a claim: one volume, two mounts; no GPU anywhere
    assert "dataset" not in volumes and volumes["output"]["persistentVolumeClaim"]["readOnly"] is False
    mounts = {v["mountPath"]: v for v in container["volumeMounts"]}
    assert mounts["/mnt/datagen/dataset"]["readOnly"] is True and mounts["/mnt/datagen/output"]["readOnly"] is False
    assert "nvidia.com/gpu" not in str(container.get("resources"))
    assert job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a"], suspend=True)["spec"]["suspend"] is True


def test_worker_role_allows_only_get_patch_on_its_shard_configmaps() -> None:
    (rule,) = run_manifests.worker_role(RUN, 3)["rules"]
    assert rule["verbs"] == ["get", "patch"]
    assert rule["resourceNames"] == ["kimi-shard-0", "kimi-shard-1", "kimi-shard-2"]
    binding = run_manifests.worker_role_binding(RUN)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kimi-worker", "namespace": "ml"}]


def test_canary_and_verify_jobs_report_through_termination_messages() -> None:
    canary = job_manifests.canary_job(RUN, SPEC, "img:1", ["http://a"], data_generation=4)
    (container,) = canary["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["datagen", "canary"]
    assert command[command.index("--termination-log") + 1] == "/dev/termination-log"
    # The run's lease, given back by a refusal that halts the run (it writes to the output it names).
    assert command[command.index("--lease-holder") + 1] == RUN.uid
    assert command[command.index("--output") + 1] == "/mnt/datagen/output/eagle3/b1"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert canary["metadata"]["annotations"][object_meta.DATA_GENERATION] == "4"
    assert canary["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    verify = job_manifests.verify_job(RUN, SPEC, "img:1")
    (container,) = verify["spec"]["template"]["spec"]["containers"]
    assert container["command"][:3] == ["datagen", "verify", "/mnt/datagen/output/eagle3/b1"]
    assert "--json" in container["command"]
    # everything it reads is read-only; only its HOME (an emptyDir) is writable
    writable = [mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly")]
    assert writable == [pod_parts.SCRATCH_HOME]


def with_export(spec: Any, **export: Any) -> Any:
    from datagen_operator.api.export_spec import ExportSpec

    return spec.model_copy(update={"export": ExportSpec.model_validate({"formats": ["speculators"], **export})})


def test_export_job_writes_inside_the_output_and_reports_through_its_termination_message() -> None:
    spec = with_export(
        SPEC, formats=["speculators", "trl"], path="for/eagle3", maxLength=4096, excludeFlags=["truncated"]
    )
    job = job_manifests.export_job(RUN, spec, "img:1")
    assert job["metadata"]["name"] == export_job_name("kimi") == "kimi-export"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["datagen", "export", "/mnt/datagen/output/eagle3/b1"]
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags["--formats"] == "speculators,trl" and flags["--out"] == "/mnt/datagen/output/eagle3/b1/for/eagle3"
    assert flags["--max-length"] == "4096" and flags["--exclude-flags"] == "truncated"
    assert flags["--termination-log"] == container["terminationMessagePath"] == "/dev/termination-log"
    # the output is the one writable data mount (besides HOME); the rules and placement are verify's
    writable = sorted(mount["mountPath"] for mount in container["volumeMounts"] if not mount.get("readOnly"))
    assert writable == sorted([OUTPUT_MOUNT, pod_parts.SCRATCH_HOME])
    verify = job_manifests.verify_job(RUN, spec, "img:1")["spec"]
    assert job["spec"]["backoffLimit"] == verify["backoffLimit"]
    assert job["spec"]["template"]["spec"]["securityContext"] == verify["template"]["spec"]["securityContext"]


def test_an_export_of_whole_conversations_reads_the_dataset_mounted_read_only() -> None:
    turns_all = SPEC.model_copy(update={"generation": SPEC.generation.model_copy(update={"turns": "all"})})
    spec = with_export(turns_all, formats=["speculators", "conversations"], rows="conversations")
    (container,) = job_manifests.export_job(RUN, spec, "img:1")["spec"]["template"]["spec"]["containers"]
    flags = dict(zip(container["command"][3::2], container["command"][4::2], strict=True))
    assert flags["--rows"] == "conversations" and flags["--formats"] == "speculators,conversations"
    assert flags["--dataset"] == dataset_file(spec)
    assert any(mount["mountPath"] == DATASET_MOUNT and mount.get("readOnly") for mount in container["volumeMounts"])
    # Per-turn rows need no dataset: none is mounted.
    (plain,) = job_manifests.export_job(RUN, with_export(SPEC), "img:1")["spec"]["template"]["spec"]["containers"]
    assert "--dataset" not in plain["command"]
    assert all(mount["mountPath"] != DATASET_MOUNT for mount in plain["volumeMounts"])


def test_spec_configmap_holds_a_loadable_run_manifest(tmp_path: Any) -> None:
    from datagen_operator.api import load_run

    cm = run_manifests.spec_configmap(RUN, SPEC, 3)
    (tmp_path / "run.yaml").write_text(cm["data"]["run.yaml"])
    assert load_run(tmp_path / "run.yaml").spec == SPEC
    assert cm["metadata"]["annotations"][object_meta.DATA_GENERATION] == "3"


def test_template_hash_moves_with_the_template_only() -> None:
    a = job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a"], suspend=False)
    b = job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a"], suspend=True)
    c = job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a", "http://b"], suspend=False)
    hashes = [j["metadata"]["annotations"][object_meta.TEMPLATE_HASH] for j in (a, b, c)]
    assert hashes[0] == hashes[1] != hashes[2]


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"controller-revision-hash": "r1"}}, "status": status}


GROUP_SPEC = parse_spec(unit_spec(**{"server.nodes": 2, "server.tensorParallel": 16}))


def test_a_server_over_two_nodes_is_a_leaderworkerset_group_per_replica() -> None:
    lws = server_manifests.server_workload(RUN, GROUP_SPEC, 3)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["metadata"]["name"] == "kimi-server"  # its leaders are kimi-server-<i>, as the StatefulSet's pods
    assert lws["metadata"]["ownerReferences"] == [RUN.owner_reference()]
    assert lws["spec"]["replicas"] == 3
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"  # SGLang's ranks cannot rejoin a running server
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    # One command for every pod of the group, its rank and leader left for the kubelet to expand from LWS's env.
    assert leader["command"] == worker["command"] == server_argv(GROUP_SPEC, host="0.0.0.0")
    assert "$(LWS_WORKER_INDEX)" in leader["command"] and "$(LWS_LEADER_ADDRESS):20000" in leader["command"]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # The leader serves the API: probes as a single-node server's.
    assert (
        leader["startupProbe"]["httpGet"]["path"] == leader["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    )
    # A worker rank serves only SGLang's health endpoint: started and alive, never "ready" for traffic.
    assert worker["startupProbe"]["httpGet"]["path"] == worker["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "readinessProbe" not in worker
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        assert template["metadata"]["labels"] == object_meta.labels("kimi", "server")
        assert template["spec"]["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]


def test_one_node_keeps_the_statefulset_exactly() -> None:
    assert server_manifests.server_workload(RUN, SPEC, 2) == server_manifests.server_statefulset(RUN, SPEC, 2)
    group_leader = server_manifests.server_leaderworkerset(RUN, GROUP_SPEC, 1)["spec"]["leaderWorkerTemplate"][
        "leaderTemplate"
    ]
    single = server_manifests.server_statefulset(RUN, SPEC, 1)["spec"]["template"]
    # The leader's pod is the single-node pod but for the command (the group's flags).
    assert {**group_leader["spec"], "containers": None} == {**single["spec"], "containers": None}


def datagen_pods(spec: Any) -> dict[str, dict[str, Any]]:
    """The pod spec of every CPU pod the operator creates for a run, by component."""
    jobs = {
        "preflight": job_manifests.preflight_job(RUN, spec, "img:1", 1),
        "canary": job_manifests.canary_job(RUN, spec, "img:1", ["http://a"], 1),
        "worker": job_manifests.workers_job(RUN, spec, "img:1", ["http://a"], suspend=False),
        "verify": job_manifests.verify_job(RUN, spec, "img:1"),
        "export": job_manifests.export_job(RUN, with_export(spec), "img:1"),
    }
    return {name: job["spec"]["template"]["spec"] for name, job in jobs.items()}


RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_cpu_pods_meet_the_restricted_standard_as_uid_10001_with_a_writable_home_only() -> None:
    for name, pod_spec in datagen_pods(SPEC).items():
        security = pod_spec["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == security["runAsGroup"] == 10001, name
        assert security["fsGroup"] == 10001 and security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        (container,) = pod_spec["containers"]
        assert container["securityContext"] == {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True}, name
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        # restricted allows only these volume types; the spec's volumes here are PVCs
        assert all(set(v) - {"name"} <= {"persistentVolumeClaim", "configMap", "emptyDir"} for v in volumes.values())
        scratch = next(mount for mount in container["volumeMounts"] if mount["mountPath"] == pod_parts.SCRATCH_HOME)
        assert "emptyDir" in volumes[scratch["name"]], name
        env = {var["name"]: var.get("value") for var in container["env"]}
        assert env["HOME"] == env["TMPDIR"] == pod_parts.SCRATCH_HOME, name


def test_server_pod_is_restricted_except_run_as_root_and_guaranteed() -> None:
    pod_spec = server_manifests.server_statefulset(RUN, SPEC, 1)["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsNonRoot" not in str(pod_spec)  # the SGLang image runs as root (docs/operator.md)
    (container,) = pod_spec["containers"]
    assert container["securityContext"] == {**RESTRICTED_CONTAINER, "readOnlyRootFilesystem": False}
    resources = container["resources"]
    # Guaranteed: requests == limits for every resource, cpu and memory included
    assert resources["requests"] == resources["limits"]
    assert resources["limits"] == {"nvidia.com/gpu": "8", "cpu": "32", "memory": f"{64 + 8 * 32}Gi"}
    own = parse_spec(
        unit_spec(**{"server.cpu": "48", "server.memory": "900Gi", "server.gpus": 4, "server.tensorParallel": 4})
    )
    limits = server_manifests.server_statefulset(RUN, own, 1)["spec"]["template"]["spec"]["containers"][0]["resources"][
        "limits"
    ]
    assert limits == {"nvidia.com/gpu": "4", "cpu": "48", "memory": "900Gi"}


@pytest.mark.parametrize(("shm", "memory"), [("64Gi", "320Gi"), ("512Mi", "257Gi"), ("1Ti", "1280Gi")])
def test_default_server_memory_leaves_room_for_the_memory_backed_shm(shm: str, memory: str) -> None:
    spec = parse_spec(unit_spec(**{"server.shmSize": shm}))
    assert pod_parts.server_resources(spec)["limits"]["memory"] == memory


def test_runtime_class_and_model_sub_path_reach_every_pod_that_mounts_the_model() -> None:
    spec = parse_spec(
        unit_spec(**{"server.runtimeClassName": "nvidia", "model.path": "/models/kimi", "model.subPath": "kimi-k2.5"})
    )
    server = server_manifests.server_statefulset(RUN, spec, 1)["spec"]["template"]["spec"]
    assert server["runtimeClassName"] == "nvidia"
    pods = {"server": server, **datagen_pods(spec)}
    for name, pod_spec in pods.items():
        (container,) = pod_spec["containers"]
        (model,) = [mount for mount in container["volumeMounts"] if mount["name"] == "model"]
        assert model == {"name": "model", "mountPath": "/models/kimi", "readOnly": True, "subPath": "kimi-k2.5"}, name
    assert "runtimeClassName" not in datagen_pods(spec)["worker"]
    assert "subPath" not in str(server_manifests.server_statefulset(RUN, SPEC, 1))


@pytest.mark.parametrize("sub_path", ["/abs", "../up", "a/../b", "a/./b", ".hidden", "a//b", "a/"])
def test_model_sub_path_cannot_leave_the_volume(sub_path: str) -> None:
    from datagen_operator.api import SpecError

    with pytest.raises((SpecError, ValueError)):
        parse_spec(unit_spec(**{"model.subPath": sub_path}))


def test_client_placement_and_resources_reach_every_cpu_pod_and_never_the_server() -> None:
    toleration = {"key": "pool", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}
    spec = parse_spec(
        unit_spec(
            **{
                "clients.nodeSelector": {"pool": "cpu"},
                "clients.tolerations": [toleration],
                "clients.cpu": "2",
                "clients.memory": "8Gi",
            }
        )
    )
    for name, pod_spec in datagen_pods(spec).items():
        assert pod_spec["nodeSelector"] == {"pool": "cpu"} and pod_spec["tolerations"] == [toleration], name
        (container,) = pod_spec["containers"]
        # Burstable: cpu may burst (tokenizing), memory is capped at its request
        assert container["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    server = server_manifests.server_statefulset(RUN, spec, 1)["spec"]["template"]["spec"]
    assert server["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert [t["key"] for t in server["tolerations"]] == ["nvidia.com/gpu"]
    # placement of the CPU pods changes no record: live, like clients.cpu
    applied = run_manifests.spec_document(SPEC)
    assert changed_data_fields(run_manifests.spec_document(spec), applied) == []


def test_canary_keeps_its_records_in_the_output() -> None:
    pod_spec = job_manifests.canary_job(RUN, SPEC, "img:1", ["http://a"], 1)["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    args = container["command"]
    assert args[args.index("--records") + 1] == "/mnt/datagen/output/eagle3/b1/canary.jsonl"
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert mounts["/mnt/datagen/output"]["readOnly"] is False
    assert mounts["/mnt/datagen/dataset"]["readOnly"] is True


def test_the_workers_job_fails_the_index_on_a_failed_volume_and_keeps_the_cause_as_its_message() -> None:
    from datagen_operator.api.exit_codes import EXIT_OUTPUT_VOLUME

    job = job_manifests.workers_job(RUN, SPEC, "img:1", ["http://a"], suspend=False)
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail_index = next(r for r in rules if r["action"] == "FailIndex")["onExitCodes"]["values"]
    assert EXIT_OUTPUT_VOLUME in fail_index  # no retry burned
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["command"]
    assert args[args.index("--termination-log") + 1] == container["terminationMessagePath"]


QUEUED = parse_spec(unit_spec(**{"queue.name": "team-a", "queue.workloadPriorityClassName": "batch-low"}))


@pytest.mark.parametrize("spec", [SPEC, GROUP_SPEC], ids=["statefulset", "leaderworkerset"])
def test_a_queued_server_carries_kueues_labels_on_its_workload_object_alone(spec: Any) -> None:
    queued = spec.model_copy(update={"queue": QUEUED.queue})
    plain, labelled = server_manifests.server_workload(RUN, spec, 2), server_manifests.server_workload(RUN, queued, 2)
    assert labelled["metadata"]["labels"] == {
        **object_meta.labels("kimi", "server"),
        "kueue.x-k8s.io/queue-name": "team-a",
        "kueue.x-k8s.io/priority-class": "batch-low",
    }
    # Nothing else moves: Kueue copies to the pods what it needs, and the restart hash stays; what Kueue admits
    # the server by (its queue) moves the admission hash.
    assert {**labelled, "metadata": {**labelled["metadata"], "labels": plain["metadata"]["labels"]}} == plain
    hashed, plain_hashed = server_hashes.with_hashes(labelled)["metadata"], server_hashes.with_hashes(plain)["metadata"]
    assert hashed["annotations"][object_meta.RESTART_HASH] == plain_hashed["annotations"][object_meta.RESTART_HASH]
    assert hashed["annotations"][object_meta.ADMISSION_HASH] != plain_hashed["annotations"][object_meta.ADMISSION_HASH]


def test_the_admission_hash_moves_with_what_kueue_admits_by_and_with_nothing_else() -> None:
    def admission(spec: DataGenRunSpec) -> str:
        return str(
            server_hashes.with_hashes(server_manifests.server_workload(RUN, spec, 2))["metadata"]["annotations"][
                object_meta.ADMISSION_HASH
            ]
        )

    base = admission(SPEC)
    # Kueue's pod shape (pkg/util/pod/pod.go SpecShape): placement and requests move it...
    assert admission(parse_spec(unit_spec(**{"server.nodeSelector": {"pool": "h200"}}))) != base
    assert admission(parse_spec(unit_spec(**{"server.gpus": 4}))) != base
    assert admission(parse_spec(unit_spec(**{"queue.name": "a"}))) != admission(
        parse_spec(unit_spec(**{"queue.name": "b"}))
    )
    # ...the image and the replica count do not (Kueue lets them change; the replica count has its own rule).
    assert admission(parse_spec(unit_spec(**{"server.image": "lmsysorg/sglang:other"}))) == base
    assert (
        str(
            server_hashes.with_hashes(server_manifests.server_workload(RUN, SPEC, 5))["metadata"]["annotations"][
                object_meta.ADMISSION_HASH
            ]
        )
        == base
    )


def test_a_queue_without_a_priority_labels_the_queue_only_and_no_queue_labels_nothing() -> None:
    only_queue = parse_spec(unit_spec(**{"queue.name": "gpus"}))
    assert object_meta.kueue_labels(only_queue) == {"kueue.x-k8s.io/queue-name": "gpus"}
    assert object_meta.kueue_labels(SPEC) == {}
    assert not any(
        key.startswith("kueue.x-k8s.io/")
        for key in server_manifests.server_statefulset(RUN, SPEC, 1)["metadata"]["labels"]
    )
    # An unset queue is no key at all in the applied spec document, so runs without one compare as before.
    assert "queue" not in run_manifests.spec_document(SPEC)


def every_job(spec: Any) -> dict[str, dict[str, Any]]:
    """Every Job the operator creates for a run (the release Job too), by component."""
    return {
        "preflight": job_manifests.preflight_job(RUN, spec, "img:1", 1),
        "canary": job_manifests.canary_job(RUN, spec, "img:1", ["http://a"], 1),
        "worker": job_manifests.workers_job(RUN, spec, "img:1", ["http://a"], suspend=False),
        "verify": job_manifests.verify_job(RUN, spec, "img:1"),
        "export": job_manifests.export_job(RUN, with_export(spec), "img:1"),
        "release": job_manifests.release_job(RUN, spec, "img:1", None),
    }


def test_a_queued_runs_jobs_carry_the_servers_kueue_labels_and_an_unqueued_runs_none() -> None:
    # One rule: where Kueue manages Jobs, every Job of the run waits in the server's LocalQueue, at its priority
    # (docs/kueue.md "The run's CPU Jobs"); the labels come from the one place the server's come from.
    server_labels = server_manifests.server_statefulset(RUN, QUEUED, 1)["metadata"]["labels"]
    wanted = {key: value for key, value in server_labels.items() if key.startswith("kueue.x-k8s.io/")}
    assert wanted == object_meta.kueue_labels(QUEUED) != {}
    queued, plain = every_job(QUEUED), every_job(SPEC)
    for name, job in queued.items():
        assert job["metadata"]["labels"] == {**plain[name]["metadata"]["labels"], **wanted}, name
        # Only the Job's own metadata: the pods, their template hash and the rest of the Job stay as they are.
        assert {**job, "metadata": plain[name]["metadata"]} == plain[name], name
    for name, job in plain.items():
        assert not any(key.startswith("kueue.x-k8s.io/") for key in job["metadata"]["labels"]), name
