"""A passed canary's verdict kept in the output beside its records, with the basis it holds for: written and read
by whichever shell's canary runs (`datagen run`, the operator's canary Job), reused by api/canary_reuse.py's rule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datagen_operator.api.canary_reuse import canary_basis, reusable_canary, stored_canary
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.output.fingerprint import chat_template_sha256, tokenizer_fingerprint
from datagen_operator.output.layout import OutputLayout


def canary_basis_here(spec: DataGenRunSpec, tokenizer_dir: Path, tokenizer: Any) -> str:
    """The basis of a canary run here: the spec, and the tokenizer files and chat template this machine (or pod)
    sees."""
    template = chat_template_sha256(getattr(tokenizer, "chat_template", None))
    return canary_basis(spec, tokenizer_fingerprint(tokenizer_dir)["sha256"], template)


def remembered_canary(output: Path, basis: str) -> StepOutcome | None:
    """The output's kept verdict when it passed for `basis`, else None."""
    try:
        stored = OutputLayout(output).canary_verdict.read_bytes()
    except FileNotFoundError:
        return None
    return reusable_canary(stored, basis)


def remember_canary(output: Path, basis: str, outcome: StepOutcome) -> None:
    verdict = OutputLayout(output).canary_verdict
    staging = verdict.with_name(f".{verdict.name}.tmp")
    staging.write_bytes(stored_canary(basis, outcome))
    os.replace(staging, verdict)
