"""k8s.release: `datagen release-finalizers` removes only the operator's finalizer."""

from __future__ import annotations


def test_release_removes_only_the_operators_finalizer_guarded_by_a_test() -> None:
    from datagen_operator.k8s.release import FINALIZER, finalizer_removal

    assert FINALIZER == "datagen.dev/finalizer"
    assert finalizer_removal(["other.io/keep"]) is None
    patch = finalizer_removal(["other.io/keep", FINALIZER])
    assert patch == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]
