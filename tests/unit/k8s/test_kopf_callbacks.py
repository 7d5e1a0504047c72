"""k8s/callbacks.py: kopf's optional namespace narrowed for the namespaced kinds the operator handles."""

from __future__ import annotations

import kopf
import pytest

from datagen_operator.k8s.callbacks import namespaced


def test_a_namespace_is_passed_through() -> None:
    assert namespaced("llm") == "llm"


def test_a_missing_namespace_is_a_permanent_error_not_a_made_up_key() -> None:
    with pytest.raises(kopf.PermanentError, match="without its namespace"):
        namespaced(None)
