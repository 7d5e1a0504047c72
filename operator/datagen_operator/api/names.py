"""What a run's name must be so that every object the operator creates for it can exist.

The API server alone accepts any DNS subdomain (dots, up to 253 characters) as a custom resource's
name; the run's children are stricter. The limit is computed from the child names below, so
a new or longer child name changes it (and the generated CRD, which a unit test keeps in sync).
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache

LABEL_VALUE_MAX = 63
"""Label values, DNS-1035 Service names and pod hostnames: at most 63 characters."""
REVISION_HASH_SUFFIX = len("-") + 10
"""The StatefulSet controller labels each server pod controller-revision-hash=<statefulset>-<hash of up to
10 characters>; longer than 63 and it can never create the pod (kubernetes#64023)."""
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""DNS-1035 label: the per-replica Services are named <run>-server-<i>, and Service names may not
contain dots or start with a digit."""
MAX_SERVER_REPLICAS = 64
"""spec.server.replicas' bound: the last replica's name is the longest per-replica child name."""
MAX_SHARDS = 10000
"""spec.clients.shards' bound: the last shard's index is part of its worker pod's hostname."""


@cache
def max_run_name_length() -> int:
    """The longest run name whose every child name and label fits in 63 characters."""
    last_replica = MAX_SERVER_REPLICAS - 1
    last_shard = MAX_SHARDS - 1
    longest_suffix = max(
        len(server_name("")) + REVISION_HASH_SUFFIX,  # server pods' controller-revision-hash label
        len(server_pod_name("", last_replica)),  # per-replica Service; the pods' pod-name label
        len(workers_job_name("")) + len(f"-{last_shard}"),  # Indexed Job pod hostname <job>-<index>
        *(
            len(job("")) for job in (preflight_job_name, canary_job_name, verify_job_name, release_job_name)
        ),  # job-name label
    )
    return LABEL_VALUE_MAX - longest_suffix


class Component(StrEnum):
    """A child's component label (and its pods' container name): which part of the run it is."""

    SERVER = "server"
    WORKER = "worker"
    PREFLIGHT = "preflight"
    CANARY = "canary"
    VERIFY = "verify"
    EXPORT = "export"
    RELEASE = "release"
    SPEC = "spec"
    """The spec-in-force ConfigMap."""
    PROGRESS = "progress"
    """The shards' progress ConfigMaps."""


# --- the names of a run's children (Kubernetes objects; the local runner names its processes alike) ---


def spec_configmap_name(run: str) -> str:
    return f"{run}-spec"


def worker_account_name(run: str) -> str:
    return f"{run}-worker"


def server_name(run: str) -> str:
    """The StatefulSet and its headless Service; pods are <run>-server-<i>."""
    return f"{run}-server"


def server_pod_name(run: str, index: int) -> str:
    return f"{run}-server-{index}"


def shard_configmap_name(run: str, index: int | str) -> str:
    """Shard `index`'s progress ConfigMap; an Indexed Job's one pod template passes "$(JOB_COMPLETION_INDEX)",
    which the kubelet expands from each pod's environment."""
    return f"{run}-shard-{index}"


def preflight_job_name(run: str) -> str:
    return f"{run}-preflight"


def canary_job_name(run: str) -> str:
    return f"{run}-canary"


def workers_job_name(run: str) -> str:
    return f"{run}-workers"


def verify_job_name(run: str) -> str:
    return f"{run}-verify"


def export_job_name(run: str) -> str:
    return f"{run}-export"


def release_job_name(run: str) -> str:
    """The Job that gives a halted run's output lease back (output/lease.py)."""
    return f"{run}-release"


NAME_CHARACTERS_MESSAGE = (
    "must be lowercase letters, digits and '-', start with a letter and end with a letter or digit "
    "(no dots: the run's Services, <name>-server-<i>, are DNS-1035 labels)"
)


def name_length_message() -> str:
    return (
        f"at most {max_run_name_length()} characters, so that the children's names and labels "
        f"(<name>-server-<revision hash> on the server pods) fit in {LABEL_VALUE_MAX}: shorten the name"
    )


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run's name (the same messages as the CRD's rules on metadata.name), or None."""
    if len(name) > max_run_name_length():
        return name_length_message()
    if not re.fullmatch(RUN_NAME_PATTERN, name):
        return NAME_CHARACTERS_MESSAGE
    return None
