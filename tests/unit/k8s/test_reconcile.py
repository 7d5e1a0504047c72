"""The operator shell's pure rules: which status writes are urgent, when a refusal shows, when a live field
may touch the server's pod template."""

from __future__ import annotations

from datagen_operator.api import parse_spec
from datagen_operator.api.status import DataGenRunStatus
from datagen_operator.control.observed import ServerInstance, ServerObservation
from datagen_operator.control.server import server_verdict
from datagen_operator.k8s import object_facts as o
from datagen_operator.k8s import object_meta, server_hashes, server_manifests
from datagen_operator.k8s.children import children_accepted
from datagen_operator.k8s.status_writer import signature
from tests.manifests import unit_spec

REFUSED = 'create Pod x-server-0 in StatefulSet x-server failed error: pods "x-server-0" is forbidden: exceeded quota'

RUN = object_meta.RunRef(name="kimi", namespace="ml", uid="u-1")
SPEC = parse_spec(unit_spec())


def event(reason: str, when: str, version: str = "1", message: str = "") -> dict:
    return {"reason": reason, "lastTimestamp": when, "message": message, "metadata": {"resourceVersion": version}}


def test_the_newest_creation_event_decides_whether_pods_are_refused() -> None:
    failed = event("FailedCreate", "2026-01-01T00:00:05Z", "7", REFUSED)
    assert o.creation_refusal([event("SuccessfulCreate", "2026-01-01T00:00:01Z"), failed]) == REFUSED
    later = event("SuccessfulCreate", "2026-01-01T00:00:05Z", "9")
    assert o.creation_refusal([failed, later]) is None, "a pod created after the refusal clears it"
    assert o.creation_refusal([event("SuccessfulDelete", "2026-01-01T00:00:09Z")]) is None


def test_a_refused_server_pod_is_named_not_creating_forever() -> None:
    verdict = server_verdict(ServerObservation(1, refused=REFUSED), 600)
    assert (verdict.condition.status, verdict.condition.reason) == ("False", "Refused") and not verdict.fatal
    assert "exceeded quota" in verdict.condition.message
    ready = ServerObservation(2, (ServerInstance("x-server-0", running=True, ready=True),), refused=REFUSED)
    assert server_verdict(ready, 600).condition.reason == "Degraded"


def test_children_accepted_shows_only_after_a_refusal_and_clears() -> None:
    fresh = DataGenRunStatus()
    assert children_accepted({}, fresh.conditions) == []
    (refused,) = children_accepted(
        {"Job/x-preflight": 'jobs.batch "x-preflight" is forbidden: exceeded quota'}, fresh.conditions
    )
    assert (refused.status, refused.reason) == ("False", "Refused") and "Job/x-preflight: jobs.batch" in refused.message
    shown = DataGenRunStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "ChildrenAccepted",
                    "status": "False",
                    "reason": "Refused",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    )
    (cleared,) = children_accepted({}, shown.conditions)
    assert (cleared.status, cleared.reason) == ("True", "Accepted")


def status(rate: float, passed: bool = True, reason: str = "Running", tokens: float = 10.0) -> dict:
    return {
        "phase": "Running",
        "conditions": [{"type": "Progressing", "status": "True", "reason": reason, "message": f"{tokens} tok/s"}],
        "checks": [{"name": "reasoning_rate", "passed": passed, "rate": rate, "count": int(rate * 100)}],
        "progress": {"tokensPerSecond": tokens},
    }


def test_only_flips_make_a_status_write_urgent() -> None:
    assert signature(status(0.99)) == signature(status(0.985, tokens=20)), "numbers only: wait for the spacing"
    assert signature(status(0.99)) != signature(status(0.5, passed=False)), "a check flips: write at once"
    assert signature(status(0.99)) != signature(status(0.99, reason="Paused")), "a condition changes"


def restart_hash(workload: object_meta.Manifest) -> str:
    return server_hashes.with_hashes(workload)["metadata"]["annotations"][object_meta.RESTART_HASH]


def test_live_fields_change_the_template_but_not_the_restart_hash() -> None:
    running = server_manifests.server_statefulset(RUN, SPEC, 1)
    server = SPEC.server.model_copy(update={"node_selector": {"pool": "h200"}, "priority_class_name": "batch"})
    placed = server_manifests.server_statefulset(RUN, SPEC.model_copy(update={"server": server}), 1)
    assert placed["spec"]["template"] != running["spec"]["template"]
    assert restart_hash(placed) == restart_hash(running)
    image = SPEC.server.model_copy(update={"image": "lmsysorg/sglang:v0.5.24"})
    assert restart_hash(
        server_manifests.server_statefulset(RUN, SPEC.model_copy(update={"server": image}), 1)
    ) != restart_hash(running)


def test_only_a_server_pod_on_a_node_holds_its_template() -> None:
    pending = {"metadata": {"name": "x-server-0"}, "spec": {}}
    bound = {"metadata": {"name": "x-server-0"}, "spec": {"nodeName": "gpu-1"}}
    leaving = {
        "metadata": {"name": "x-server-0", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "g"},
    }
    assert not o.holds_a_node([pending]) and o.holds_a_node([bound]) and not o.holds_a_node([leaving])


def test_status_writes_are_urgent_only_for_transitions() -> None:
    base = {
        "phase": "Starting",
        "conditions": [{"type": "ServerReady", "status": "False", "reason": "Loading", "message": "loading: 1m"}],
        "progress": {"summary": "0/10 prompts"},
    }
    later = {
        **base,
        "conditions": [{**base["conditions"][0], "message": "loading: 2m"}],
        "progress": {"summary": "1/10"},
    }
    assert signature(later) == signature(base)
    moved = {**base, "conditions": [{**base["conditions"][0], "status": "True", "reason": "Ready"}]}
    assert signature(moved) != signature(base)
