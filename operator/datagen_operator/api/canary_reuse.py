"""When a passed canary is reused instead of run again: one rule for both shells. A canary verdict holds for what
it was run for, its basis: the spec's fields that decide the records or judge them (every field but the live
ones, the checks included), the tokenizer's files and the chat template. `datagen run` and the operator's canary
Job keep a passed verdict in the output with its basis (output/canary_verdict.py) and reuse it only for the same
basis, so changed tokenizer files run the canary again in either shell. Pure."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import orjson

from datagen_operator.api.live_fields import LIVE_FIELDS, without_fields
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.spec import DataGenRunSpec

REUSED = "passed before with the same fingerprint (not rerun)"
"""How a reused verdict's message begins."""


def canary_basis(spec: DataGenRunSpec, tokenizer_sha256: str, chat_template_sha256: str | None) -> str:
    """What a canary verdict holds for, as one hash: a resume with all of it unchanged needs no second canary."""
    document = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    judged = without_fields(document, [path for path in LIVE_FIELDS if path != ("checks",)])
    basis = {"spec": judged, "tokenizer": tokenizer_sha256, "chat_template": chat_template_sha256}
    return hashlib.sha256(orjson.dumps(basis, option=orjson.OPT_SORT_KEYS)).hexdigest()


def stored_canary(basis: str, outcome: StepOutcome) -> bytes:
    """A verdict as the output keeps it, with its basis."""
    return orjson.dumps({"key": basis, "outcome": orjson.loads(outcome.for_storage())})


def reusable_canary(stored: bytes, basis: str) -> StepOutcome | None:
    """The kept verdict when it passed for this very basis, else None (run the canary): any other basis, a
    failed verdict, or a file that does not parse."""
    try:
        data = orjson.loads(stored)
        outcome = StepOutcome.from_storage(orjson.dumps(data["outcome"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    if data.get("key") != basis or not outcome.passed:
        return None
    return replace(outcome, message=f"{REUSED}: {outcome.message}")
