"""What the operator can see of a run's storage: a claim whose access mode cannot serve the pods that share it.

A ReadWriteOnce claim attaches to one node. The server (on a GPU node) and the CPU pods (preflight, canary,
workers, verify) run at the same time on different nodes as a rule, and so do the workers of a sharded run,
so such a claim fails with `Multi-Attach error` in the second pod's events. The check runs when a run is
created or its spec changes and says so as a Warning event on the run (docs/operator.md, "Volumes").
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from datagen_operator.api import SpecError, parse_spec
from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL, DataGenRunSpec
from datagen_operator.control.conditions import Event
from datagen_operator.k8s.callbacks import namespaced
from datagen_operator.k8s.status_writer import post_run_event

ONE_NODE_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


def shared_claims(spec: DataGenRunSpec) -> dict[str, str]:
    """claim name -> which pods share it across nodes, for the claims that must be mountable on several."""
    shared: dict[str, str] = {}
    if spec.output.volume and spec.output.volume.persistent_volume_claim and spec.clients.shards > 1:
        claim = spec.output.volume.persistent_volume_claim.claim_name
        shared[claim] = f"{spec.clients.shards} worker shards write the output at once"
    if spec.dataset.volume and spec.dataset.volume.persistent_volume_claim and spec.clients.shards > 1:
        claim = spec.dataset.volume.persistent_volume_claim.claim_name
        shared.setdefault(claim, f"{spec.clients.shards} worker shards read the dataset at once")
    if spec.model.volume and spec.model.volume.persistent_volume_claim:
        claim = spec.model.volume.persistent_volume_claim.claim_name
        shared.setdefault(claim, "the server (GPU node) and the CPU pods read the model at once")
    return shared


def access_mode_warnings(spec: DataGenRunSpec, modes: dict[str, list[str]]) -> list[str]:
    """One sentence per shared claim that only one node can mount (`modes`: claim -> its access modes)."""
    return [
        f"PersistentVolumeClaim {claim} is {'/'.join(modes[claim])}, but {why}: pods on different nodes fail "
        "with Multi-Attach. Use ReadWriteMany (output) or ReadOnlyMany (model, dataset), or pin the pods to one "
        "node (clients.nodeSelector)"
        for claim, why in shared_claims(spec).items()
        if modes.get(claim) and set(modes[claim]) <= ONE_NODE_MODES
    ]


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec")
async def check_claims(spec: kopf.Spec, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    namespace = namespaced(namespace)
    try:
        parsed = parse_spec(dict(spec))
    except SpecError:
        return  # the run's own pass reports an invalid spec
    modes: dict[str, list[str]] = {}
    for claim in shared_claims(parsed):
        try:
            found = await memo.ctx.kube.core.read_namespaced_persistent_volume_claim(claim, namespace)
        except ApiException as error:
            if error.status in (403, 404):
                continue  # a missing claim keeps its pods Pending, which the run reports itself
            raise
        modes[claim] = list(found.status.access_modes or found.spec.access_modes or [])
    for warning in access_mode_warnings(parsed, modes):
        # Posted as the run's transitions are (a namespace being deleted refuses it: nothing to retry then).
        await post_run_event(memo.ctx, body, Event("Warning", "StorageAccessMode", warning))
