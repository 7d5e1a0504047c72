"""The preflight: what can be checked before a server is launched (on GPUs: before a 45-minute model load).

- the dataset holds at least one valid prompt (lines set aside are counted by cause);
- the tokenizer loads and renders the dataset's first prompt;
- an output that already exists was made with the same tokenizer files, chat template, sampling, preset
  and thinking switch (the server's part of the fingerprint is compared by the workers, once it runs).

One implementation for the operator (a Job, verdict in the termination message) and the local runner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks import record_checks as rc
from datagen_operator.control.observed import StepOutcome
from datagen_operator.engine.requests import run_sampling

PREFLIGHT = "preflight"


def run_preflight(
    spec: DataGenRunSpec, tokenizer: Any, tokenizer_dir: Path, dataset: Path, output: Path
) -> StepOutcome:
    """Every pre-launch check; the first failure is the verdict, with the field and the fix."""
    from datagen_operator.worker.dataset import DatasetError, check_dataset
    from datagen_operator.worker.fingerprint import (
        build_fingerprint,
        chat_template_sha256,
        prelaunch_changes,
        tokenizer_fingerprint,
    )
    from datagen_operator.worker.render import Renderer, template_variables
    from datagen_operator.worker.store import read_manifest

    try:
        summary = check_dataset(dataset, spec.dataset.format)
    except DatasetError as error:  # EmptyDataset is one
        return _failed("DatasetUnusable", str(error))
    aside = sum(summary.set_aside.values())
    found = f"{summary.prompts} prompts in {dataset}" + (f" ({aside} lines set aside)" if aside else "")

    resolved = resolve_model(spec)
    expect = rc.expectations_for(resolved, tokenizer, rc.read_model_eos_ids(tokenizer_dir))
    renderer = Renderer(tokenizer, template_variables(resolved))
    manifest = read_manifest(output)
    if manifest is None:
        return _passed(f"{found}; {output} is new")
    current = build_fingerprint(
        tokenizer=tokenizer_fingerprint(tokenizer_dir),
        chat_template=chat_template_sha256(renderer.chat_template),
        server={},
        sampling=run_sampling(spec.generation.sampling, expect.stop_token_ids),
        preset=resolved.preset.name if resolved.preset else None,
        thinking=resolved.thinking,
    )
    changes = prelaunch_changes(manifest.get("fingerprint", {}), current)
    if changes:
        return _failed(
            "FingerprintMismatch",
            f"{output} was generated with a different fingerprint; changed: {'; '.join(changes)}. Resume with the "
            "same tokenizer, template and generation settings, or write to a new spec.output.path",
        )
    return _passed(f"{found}; {output} resumes with the same fingerprint")


def _passed(message: str) -> StepOutcome:
    return StepOutcome(True, "Passed", message, (CheckResult(name=PREFLIGHT, passed=True, total=1, verdict=message),))


def _failed(reason: str, message: str) -> StepOutcome:
    check = CheckResult(name=PREFLIGHT, passed=False, count=1, total=1, verdict=message)
    return StepOutcome(False, reason, message, (check,))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen preflight", description="Check the dataset, tokenizer and output before a server is launched."
    )
    parser.add_argument("--run", required=True, help="the DataGenRun manifest")
    parser.add_argument("--tokenizer", help="tokenizer dir (default: model.tokenizerPath or model.path)")
    parser.add_argument("--dataset", help="dataset file (default: spec.dataset.path)")
    parser.add_argument("--output", help="output dir (default: spec.output.path)")
    parser.add_argument("--termination-log", help="also write the JSON verdict here (Kubernetes termination message)")
    args = parser.parse_args(argv)

    from datagen_operator.api import load_run
    from datagen_operator.checks.canary import outcome_json
    from datagen_operator.worker.render import load_tokenizer

    spec = load_run(args.run).spec
    tokenizer_dir = Path(args.tokenizer or spec.model.tokenizer_path or spec.model.path)
    tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=resolve_model(spec).trust_remote_code)
    outcome = run_preflight(
        spec,
        tokenizer,
        tokenizer_dir,
        Path(args.dataset or spec.dataset.path),
        Path(args.output or spec.output.path),
    )
    data = outcome_json(outcome)
    sys.stdout.write(data.decode() + "\n")
    if args.termination_log:
        Path(args.termination_log).write_bytes(data)
    return 0 if outcome.passed else 1
