"""One schema, one verdict: every manifest of the mutation corpus (tests/schema_corpus.py) is accepted
or refused alike by `datagen validate` and the real API server (with the installed CRD), and when both
refuse, both name the same fields."""

from __future__ import annotations

import json
import re
from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.operator.conftest import GROUP, PLURAL, VERSION, Runs
from tests.schema_corpus import MUTATIONS, validate_verdict

MIN_CORPUS = 40
NO_FIELD = "<nil>"
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def server_verdict(runs: Runs, manifest: dict[str, Any]) -> set[str]:
    """The fields the API server names when it refuses `manifest` (empty: accepted). Strict field
    validation, as kubectl sends it, so unknown keys are refused instead of silently pruned."""
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": runs.namespace}}
    try:
        runs.custom.create_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, PLURAL, manifest, dry_run="All", field_validation="Strict"
        )
    except ApiException as error:
        assert error.status in (400, 422), f"unexpected refusal {error.status}: {error.body}"
        body = json.loads(error.body)
        if error.status == 400:  # strict decoding: unknown fields, refused before any validation
            return set(_UNKNOWN_FIELD.findall(body["message"]))
        # The API server adds a field-less cause when it skips CEL rules of an object already invalid.
        return {cause["field"] for cause in body["details"]["causes"] if cause.get("field") != NO_FIELD}
    return set()


def _verdict(fields: set[str]) -> str:
    return "refused " + ", ".join(sorted(fields)) if fields else "accepted"


def test_validate_and_the_api_server_agree_on_every_mutation(runs: Runs) -> None:
    assert len(MUTATIONS) >= MIN_CORPUS
    rows, disagreements = [], []
    for mutation in MUTATIONS:
        manifest = mutation.manifest()
        server, validate = server_verdict(runs, manifest), validate_verdict(manifest)
        expected = {mutation.refused_at} if mutation.refused_at else set()
        agree = validate == expected and server == expected
        rows.append(f"{'ok ' if agree else 'XX '} {mutation.id:<48} {_verdict(server):<60} {_verdict(validate)}")
        if not agree:
            disagreements.append(rows[-1])
    print(f"\n    {'mutation':<48} {'API server':<60} datagen validate")
    print("\n".join(rows))
    assert not disagreements, f"{len(disagreements)} of {len(MUTATIONS)} disagree:\n" + "\n".join(disagreements)
