"""control/conditions.needs_a_person: a Warning event only for what a person must act on, once (issue 34 item 5).
A halt is one Warning (Succeeded's), not two; a server waiting for GPUs in use is Normal on a shared cluster; a
server no node can take (a taint, a selector) is a Warning."""

from __future__ import annotations

from datagen_operator.api.status import Condition
from datagen_operator.control.conditions import never_fits, transition_events, waiting_for_resources
from datagen_operator.control.observed import ServerInstance, ServerObservation
from datagen_operator.control.server import NEVER_FITS_HINT, server_verdict

BUSY = "edited-server-0: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
MIXED = "s-0: 0/4 nodes are available: 1 node(s) had untolerated taint {gpu: x}, 3 Insufficient nvidia.com/gpu."
TAINTED = "s-0: 0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: present}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."


def c(type_: str, status: str, reason: str, message: str = "") -> Condition:
    return Condition.model_validate(
        {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-12-03T00:00:00Z",
        }
    )


def types(after: list[Condition]) -> dict[str, str]:
    return {e.reason: e.type for e in transition_events([], after)}


def test_a_halt_is_one_warning() -> None:
    halted = [c("Progressing", "False", "DatasetChanged", "x"), c("Succeeded", "False", "DatasetChanged", "x")]
    assert types(halted) == {"ProgressingDatasetChanged": "Normal", "SucceededDatasetChanged": "Warning"}
    checks = [c("Progressing", "False", "Halted", "no GPU time"), c("Succeeded", "False", "PreflightFailed", "x")]
    assert types(checks) == {"ProgressingHalted": "Normal", "SucceededPreflightFailed": "Warning"}
    # Progressing=False with nothing failed (no Succeeded=False beside it) still warns: it is the only word.
    assert types([c("Progressing", "False", "WorkersFailed", "x")]) == {"ProgressingWorkersFailed": "Warning"}


# kube-scheduler v1.35.4's own words (the testbin's, two 8-GPU nodes): a pod asking for 8 GPUs while both nodes'
# are in use, and one asking for 16.
REAL_BUSY = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
REAL_TOO_BIG = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
SOME_TOO_SMALL = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."


def test_a_pod_that_no_node_can_ever_hold_is_a_warning_with_what_to_change() -> None:
    assert waiting_for_resources(REAL_BUSY) and not never_fits(REAL_BUSY)
    assert never_fits(REAL_TOO_BIG) and not waiting_for_resources(REAL_TOO_BIG)
    assert waiting_for_resources(SOME_TOO_SMALL), "one node only busy: waiting is enough"
    assert types([c("ServerReady", "False", "Unschedulable", REAL_TOO_BIG)]) == {"ServerReadyUnschedulable": "Warning"}
    pending = ServerInstance("big-server-0", scheduled=False, unschedulable_message=REAL_TOO_BIG)
    message = server_verdict(ServerObservation(1, (pending,)), 2700).condition.message
    assert message.startswith(f"big-server-0: {REAL_TOO_BIG}") and NEVER_FITS_HINT in message
    waiting = ServerInstance("s-0", scheduled=False, unschedulable_message=REAL_BUSY)
    assert server_verdict(ServerObservation(1, (waiting,)), 2700).condition.message == f"s-0: {REAL_BUSY}"


def test_waiting_for_gpus_in_use_is_normal_and_no_node_that_fits_is_a_warning() -> None:
    assert waiting_for_resources(BUSY) and waiting_for_resources(MIXED) and not waiting_for_resources(TAINTED)
    assert types([c("ServerReady", "False", "Unschedulable", BUSY)]) == {"ServerReadyUnschedulable": "Normal"}
    assert types([c("ServerReady", "False", "Unschedulable", TAINTED)]) == {"ServerReadyUnschedulable": "Warning"}
    assert types([c("ServerReady", "False", "CrashLoop", "x")]) == {"ServerReadyCrashLoop": "Warning"}
