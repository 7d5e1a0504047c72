"""k8s.storage: a claim whose access mode cannot serve the pods that share it."""

from __future__ import annotations

from datagen_operator.api import parse_spec
from tests.manifests import unit_spec

SPEC = parse_spec(unit_spec())


def test_one_node_claims_shared_across_nodes_are_warned_about() -> None:
    from datagen_operator.k8s.storage import access_mode_warnings, shared_claims

    # SPEC: models claim (server + CPU pods), data claim for dataset and output with 3 shards
    assert set(shared_claims(SPEC)) == {"models", "data"}
    assert "3 worker shards write the output" in shared_claims(SPEC)["data"]
    fine = {"models": ["ReadOnlyMany"], "data": ["ReadWriteMany"]}
    assert access_mode_warnings(SPEC, fine) == []
    (warning,) = access_mode_warnings(SPEC, {**fine, "data": ["ReadWriteOnce"]})
    assert warning.startswith("PersistentVolumeClaim data is ReadWriteOnce") and "Multi-Attach" in warning
    (warning,) = access_mode_warnings(SPEC, {**fine, "models": ["ReadWriteOncePod"]})
    assert "the server (GPU node) and the CPU pods" in warning
    assert access_mode_warnings(SPEC, {"models": ["ReadOnlyMany"]}) == []  # a missing claim: no guess
    one_shard = parse_spec(unit_spec(**{"clients.shards": 1}))
    assert set(shared_claims(one_shard)) == {"models"}  # one worker: RWO output is fine
