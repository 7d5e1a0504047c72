"""control/conditions.needs_a_person: a Warning event only for what a person must act on, once (issue 34 item 5).
A halt is one Warning (Succeeded's), not two; a server waiting for GPUs in use is Normal on a shared cluster; a
server no node can take (a taint, a selector) is a Warning."""

from __future__ import annotations

from datagen_operator.api.status import Condition
from datagen_operator.control.conditions import transition_events, waiting_for_resources

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


def test_waiting_for_gpus_in_use_is_normal_and_no_node_that_fits_is_a_warning() -> None:
    assert waiting_for_resources(BUSY) and waiting_for_resources(MIXED) and not waiting_for_resources(TAINTED)
    assert types([c("ServerReady", "False", "Unschedulable", BUSY)]) == {"ServerReadyUnschedulable": "Normal"}
    assert types([c("ServerReady", "False", "Unschedulable", TAINTED)]) == {"ServerReadyUnschedulable": "Warning"}
    assert types([c("ServerReady", "False", "CrashLoop", "x")]) == {"ServerReadyCrashLoop": "Warning"}
