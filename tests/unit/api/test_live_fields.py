"""api.live_fields: which spec fields may change on a live run."""

from __future__ import annotations

from datagen_operator.api import parse_spec
from datagen_operator.api.live_fields import changed_data_fields, merge_live_fields
from datagen_operator.k8s import run_manifests
from tests.manifests import unit_spec

SPEC = parse_spec(unit_spec())


def test_data_fields_freeze_while_live_fields_pass() -> None:
    applied = run_manifests.spec_document(SPEC)
    new = run_manifests.spec_document(
        parse_spec(unit_spec(**{"clients.shards": 3, "clients.concurrency": 64, "suspend": True}))
    )
    assert changed_data_fields(new, applied) == []
    changed = run_manifests.spec_document(parse_spec(unit_spec(**{"model.path": "/models/other", "clients.shards": 4})))
    assert changed_data_fields(changed, applied) == ["spec.clients.shards", "spec.model.path"]
    merged = merge_live_fields(changed | {"suspend": True}, applied)
    assert merged["model"]["path"] == "/models/kimi" and merged["suspend"] is True
    assert merged["clients"]["shards"] == 3
