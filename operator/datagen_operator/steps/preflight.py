"""The preflight: what can be checked before a server is launched (on GPUs: before a 45-minute model load).

- the dataset holds at least one valid prompt (lines set aside are counted by cause);
- the tokenizer loads and renders the dataset's first prompt;
- an output that already exists was made with the same tokenizer files, chat template, sampling, preset
  and thinking switch (the server's part of the fingerprint is compared by the workers, once it runs);
- the output volume has room for what is left to write: refused when even the least the output can take
  does not fit (every answer one token), a warning when the most it can take does not (every answer at
  max_new_tokens). Bytes per token are measured on this dataset's own rendered tokens, through the worker's
  segment encoder and the Parquet writer.

One implementation for the operator (a Job, verdict in the termination message) and the local runner.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from datagen_operator.api.commands import PreflightCommand
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.api.step_program import add_shared_arguments, write_verdict
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import (
    CHECK_FLAGS,
    MIN_RECORDS_TO_JUDGE,
    THRESHOLD_FIELDS,
    CheckContext,
    check_context,
    measured,
    record_checks,
)
from datagen_operator.checks.samples import compared_samples
from datagen_operator.checks.server_truth import external_server_flags
from datagen_operator.engine.limits import ContextLimit, model_context_limit
from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from datagen_operator.engine.requests import run_sampling
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import (
    STEP_MARGIN_S,
    STEP_PREFLIGHT,
    Holder,
    OutputInUse,
    claim_output,
    lease_holder,
    release_lease,
)
from datagen_operator.output.volume import is_volume_error
from datagen_operator.steps.output_room import (
    OutputEstimate,
    estimate_output,
    planned_records,
    records_done,
    room_verdict,
)
from datagen_operator.steps.render_pass import DatasetLines, RenderedStore, judge_dataset

PREFLIGHT = "preflight"


def run_preflight(
    spec: DataGenRunSpec,
    tokenizer: Any,
    tokenizer_dir: Path,
    dataset: Path,
    output: Path,
    holder: Holder | None = None,
) -> StepOutcome:
    """Every pre-launch check; the first failure is the verdict, with the field and the fix.

    With a holder (a run), the output's lease is taken first, for the server's startup budget and the canary
    (output/lease.py), and given back when the verdict refuses: nothing will be generated then. Without one (a
    check by hand) a lease of any run is only respected."""
    try:
        claim_output(output, holder, spec.server.startup_timeout + STEP_MARGIN_S, STEP_PREFLIGHT)
    except OutputInUse as busy:
        return _failed(Reason.OUTPUT_IN_USE, str(busy))
    except OSError as error:
        if not is_volume_error(error):
            raise  # a full volume is the room verdict's to name, below
    outcome = _judge(spec, tokenizer, tokenizer_dir, dataset, output)
    if holder is not None and not outcome.passed:
        release_lease(output, holder)
    if outcome.passed and spec.server.external is not None:
        # Said before any server is read, so the deployer knows the flags the parser check will look for.
        outcome = replace(outcome, message=f"{outcome.message}; {external_server_flags(spec)}")
    return outcome


def _judge(spec: DataGenRunSpec, tokenizer: Any, tokenizer_dir: Path, dataset: Path, output: Path) -> StepOutcome:
    from datagen_operator.output.rendered import render_identity, start_key, start_values
    from datagen_operator.prompts.dataset_ref import DatasetError, DatasetRef
    from datagen_operator.prompts.pin import LinePins, changed_message, pin_dataset, render_date
    from datagen_operator.prompts.render import Renderer, template_variables
    from datagen_operator.prompts.scan import ShardScan
    from datagen_operator.prompts.summary import check_lines

    resolved = resolve_model(spec)
    config_dir = model_config_dir(spec.model.path, tokenizer_dir)
    expect = rc.expectations_for(resolved, tokenizer, read_model_eos_ids(config_dir))
    rendered_on = render_date(output)
    variables = template_variables(resolved, rendered_on)
    renderer = Renderer(tokenizer, variables)
    model_dir = Path(spec.model.path) if (Path(spec.model.path) / "config.json").is_file() else tokenizer_dir
    limit = model_context_limit(_read_config(model_dir), spec.server.extra_args)
    store = RenderedStore.begin(output)
    try:
        scan = ShardScan(DatasetRef.of(spec.dataset, dataset), 0, 1)
        # A JSONL dataset is pinned by the very read that renders it; other formats by a read of their own.
        pins = LinePins(scan.dataset, rendered_on) if scan.format == "jsonl" else None
        scan.lines = pins
        lines = render_dataset(spec, scan, renderer, variables, tokenizer_dir, resolved.trust_remote_code, limit, store)
        check_lines(scan, lines.prompts, lines.malformed)  # raises EmptyDataset or UnknownDatasetShape, naming why
    except (DatasetError, OSError) as error:  # EmptyDataset is one
        store.abandon()
        said = str(error) if isinstance(error, DatasetError) else f"{error.strerror or error}"
        named = said if said.startswith("spec.dataset.path") else f"spec.dataset.path {dataset}: {said}"
        return _failed(Reason.DATASET_UNUSABLE, named)
    pin = pins.pin() if pins is not None else pin_dataset(scan.dataset)
    subset = scan.subset.said() if scan.subset is not None else ""
    outcome = _judge_rendered(spec, expect, renderer, lines, pin, dataset, output, tokenizer_dir, subset)
    changed = store.disagrees_with(pin)
    if changed and outcome.passed:
        outcome = _failed(Reason.DATASET_CHANGED, changed_message(dataset, f"{changed} while the preflight read it"))
    if outcome.passed:
        identity = render_identity(
            renderer.template, renderer.variables, tokenizer_dir, spec.generation.turns,
            history_reasoning=spec.generation.history_reasoning,
        )  # fmt: skip
        # What a worker sends before it loads the tokenizer, under the key it can read from files (rendered.py).
        sampling = run_sampling(spec.generation.sampling, expect.stop_token_ids)
        start = {
            "key": start_key(spec, resolved, tokenizer_dir, variables),
            **start_values(sampling, renderer.chat_template),
        }
        store.finish(pin, identity, start)
    else:
        store.abandon()
    return outcome


def _judge_rendered(
    spec: DataGenRunSpec, expect: rc.Expectations, renderer: Any, lines: DatasetLines, pin: Any, dataset: Path,
    output: Path, tokenizer_dir: Path, subset: str = "",
) -> StepOutcome:  # fmt: skip
    """The verdicts after the pass over the dataset: its lines, the pin, the room, an existing output. `subset`:
    what dataset.sample keeps, said."""
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.pin import changed_message, pin_changes, read_pin, write_pin

    if lines.failed:
        return _failed(
            Reason.DATASET_UNUSABLE,
            f"spec.dataset.path {dataset}: {lines.failed}; {lines.examples}. Refused before any server started: fix "
            "or remove those lines (the first of each cause are named above), or point spec.dataset.path at the right "
            "file",
        )
    found = f"{plural(lines.prompts, 'prompt')} in {dataset}" + (
        f" ({lines.set_aside} set aside)" if lines.set_aside else ""
    )
    found += f" ({lines.said})" if lines.said else ""
    found += f" ({subset})" if subset else ""
    pinned = read_pin(output)
    changed = pin_changes(pinned, pin) if pinned is not None else None
    if changed is not None:
        return _failed(Reason.DATASET_CHANGED, changed_message(dataset, changed))
    manifest = read_manifest(output)
    estimate = estimate_output(spec, lines, manifest)
    free = free_bytes(output)
    # The store is written by now: its room is counted in the estimate, so it is given back to the free space.
    room = room_verdict(estimate, output, free + stored_bytes(output) if free is not None else None)
    if not room.passed:
        return _failed(Reason.OUTPUT_VOLUME_TOO_SMALL, room.message)
    found += f"; {room.message}" if room.message else ""
    if manifest is None:
        if pinned is None:  # an unchanged pin stays as it is: its render date with it
            write_pin(output, pin)
        return _lines_passed(spec, lines)(f"{found} (pinned: sha256 {pin.sha256[:12]}); {output} is new", lines.prompts)
    outcome = _judge_existing(spec, expect, renderer, lines, manifest, output, tokenizer_dir, found)
    if outcome.passed and pinned is None:
        write_pin(output, pin)  # an output started before datasets were pinned: pinned from now on
    return outcome


def _lines_passed(spec: DataGenRunSpec, lines: DatasetLines) -> partial[StepOutcome]:
    """_passed with the dataset's records per sample where whole conversations are planned."""
    return partial(_passed, turns=lines.turns if spec.generation.turns == "all" else None)


def _judge_existing(
    spec: DataGenRunSpec, expect: rc.Expectations, renderer: Any, lines: DatasetLines, manifest: dict[str, Any],
    output: Path, tokenizer_dir: Path, found: str,
) -> StepOutcome:  # fmt: skip
    """An output that already exists: made with the same fingerprint, its records passing the checks a resume is
    judged by; complete (nothing to generate) or resumed."""
    changes = _fingerprint_changes(spec, expect, renderer, manifest, tokenizer_dir)
    if changes:
        return _failed(
            Reason.FINGERPRINT_MISMATCH,
            f"{output} was generated with a different fingerprint; changed: {'; '.join(changes)}. Resume with the "
            "same tokenizer, template and generation settings, or write to a new spec.output.path",
        )
    resolved = resolve_model(spec)
    existing = judge_existing_records(
        output, expect, check_context(resolved, spec.checks, expect.think_end_id), compared_samples(spec)
    )
    if existing.failed:
        return _failed(
            Reason.OUTPUT_FAILS_CHECKS,
            f"spec.output.path {output} already holds {plural(existing.records, 'record')} that fail the checks a resume "
            f"would be judged by: {existing.failed}. Refused before any server started: write to a new "
            f"spec.output.path, or, if these records are acceptable, raise {existing.fields} (datagen export "
            f"--exclude-flags {existing.flags} leaves the flagged records out of the training data)",
        )
    passed = _lines_passed(spec, lines)
    if output_complete(manifest, planned_records(spec, lines)):
        return passed(
            f"{found}; {output} already holds every record ({existing.records} pass the checks): nothing to "
            "generate, no server needed; verifying the output",
            lines.prompts,
            complete=True,
            recorded=existing.records,
        )
    return passed(
        f"{found}; {output} resumes with the same fingerprint ({plural(existing.records, 'record')} {agrees(existing.records, 'passes', 'pass')} the checks)",
        lines.prompts,
        recorded=existing.records,
    )


def _fingerprint_changes(
    spec: DataGenRunSpec, expect: rc.Expectations, renderer: Any, manifest: dict[str, Any], tokenizer_dir: Path
) -> list[str]:
    """What differs between an existing output's fingerprint and this spec's, of what is known before a server."""
    from datagen_operator.output.fingerprint import (
        build_fingerprint,
        chat_template_sha256,
        prelaunch_changes,
        tokenizer_fingerprint,
    )

    resolved = resolve_model(spec)
    current = build_fingerprint(
        tokenizer=tokenizer_fingerprint(tokenizer_dir),
        chat_template=chat_template_sha256(renderer.chat_template),
        server={},
        sampling=run_sampling(spec.generation.sampling, expect.stop_token_ids),
        preset=resolved.preset.name if resolved.preset else None,
        thinking=resolved.thinking,
        turns=spec.generation.turns,
        template_variables=resolved.template_variables,
        history_reasoning=spec.generation.history_reasoning,
        dataset_sample=spec.dataset.sample,
        template_variable_mix=spec.generation.template_variable_mix,
    )
    changes: list[str] = prelaunch_changes(manifest.get("fingerprint", {}), current)
    return changes


EAGER_HELPERS_BYTES = 4 << 20
"""A dataset this large (~20k short prompts) starts the render helpers at once: below it, a helper's start (its
own tokenizer, a second or more of CPU) can cost more than it saves, and RenderPool starts them if it does not."""


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def render_dataset(
    spec: DataGenRunSpec, scan: Any, renderer: Any, variables: dict[str, Any], tokenizer_dir: Path,
    trust_remote_code: bool, limit: ContextLimit, store: RenderedStore, processes: int | None = None,
) -> DatasetLines:  # fmt: skip
    """The pass over the dataset (steps/render_pass.py) with the workers' render helpers, one per core the pod
    may use (`processes`: that many instead), started at once; `variables` as the renderer was made with."""
    import asyncio

    from datagen_operator.prompts.draws import variable_draws
    from datagen_operator.prompts.render import RenderPool, available_cores

    pool = RenderPool(
        variables, tokenizer_dir, trust_remote_code, available_cores() if processes is None else processes
    )
    pool.renderer = renderer
    if _size_of(scan.path) >= EAGER_HELPERS_BYTES:
        pool.start("the preflight renders every prompt")  # else once rendering inline takes long (RenderPool)
    try:
        generation = spec.generation
        judged = judge_dataset(
            scan, generation.turns, generation.sampling.max_new_tokens, limit, pool, store,
            history_reasoning=generation.history_reasoning, draws=variable_draws(generation.template_variable_mix),
        )  # fmt: skip
        return asyncio.run(judged)
    finally:
        pool.close()


def output_complete(manifest: dict[str, Any], wanted: int) -> bool:
    """Every shard finished and every sample the spec asks for has its record (or was refused or set aside for
    good): what the shards' manifest entries count, written as each shard completes, so never more than there is."""
    counts = manifest.get("counts") or {}
    shards = int(manifest.get("shard_count") or 0)
    return shards > 0 and int(counts.get("shards_complete") or 0) >= shards and records_done(manifest) >= wanted


# --- what is known before a server: an existing output's records ---------------------------------


@dataclass(frozen=True)
class ExistingRecords:
    """An existing output's records judged by the rolling checks' record rules (checks.evaluate.record_checks)."""

    records: int
    checks: list[CheckResult]
    """Empty below MIN_RECORDS_TO_JUDGE records, as for the rolling checks."""

    @property
    def failed(self) -> str:
        return "; ".join(f"{measured(c)}: {c.verdict}" for c in self.checks if not c.passed)

    @property
    def fields(self) -> str:
        names = {THRESHOLD_FIELDS[c.name] for c in self.checks if not c.passed and c.name in THRESHOLD_FIELDS}
        return " and ".join(sorted(names)) or "nothing (these checks have no threshold to raise)"

    @property
    def flags(self) -> str:
        """The flags the failed checks count, for `datagen export --exclude-flags`."""
        return ",".join(sorted({flag for c in self.checks if not c.passed for flag in CHECK_FLAGS.get(c.name, ())}))


def judge_existing_records(
    output: Path, expect: rc.Expectations, ctx: CheckContext, compared: int = 0
) -> ExistingRecords:
    """The records an output already holds, flagged by the same rules and judged by the same thresholds as
    the rolling checks will judge the whole output (their prompts' samples compared when `compared` is 2 or
    more): a resume over records that already fail is refused here, not after the GPU time."""
    from datagen_operator.steps.verify_reads import stored_record_counts

    counts = stored_record_counts(output, expect, compared)
    if counts.records < MIN_RECORDS_TO_JUDGE:
        return ExistingRecords(counts.records, [])
    return ExistingRecords(counts.records, record_checks(counts, ctx))


def _read_config(model_dir: Path) -> dict[str, Any]:
    import json

    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


# --- the output volume (the estimate and its verdict: steps/output_room.py) -----------------------


def estimate_for(spec: DataGenRunSpec, tokenizer: Any, tokenizer_dir: Path) -> OutputEstimate:
    """The preflight's estimate of what `spec`'s output will take, on its own (rendered inline, nothing stored)."""
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.dataset_ref import DatasetRef
    from datagen_operator.prompts.render import Renderer, template_variables
    from datagen_operator.prompts.scan import ShardScan

    variables = template_variables(resolve_model(spec))
    renderer = Renderer(tokenizer, variables)
    scan = ShardScan(DatasetRef.of(spec.dataset), 0, 1)
    lines = render_dataset(
        spec, scan, renderer, variables, tokenizer_dir, False, ContextLimit(None, None), RenderedStore(None), 0
    )
    return estimate_output(spec, lines, read_manifest(Path(spec.output.path)))


def stored_bytes(output: Path) -> int:
    """The bytes the rendered store's files hold on the volume now."""
    directory = OutputLayout(output).rendered
    return sum(path.stat().st_size for path in directory.glob("*") if path.is_file()) if directory.is_dir() else 0


def free_bytes(output: Path) -> int | None:
    from datagen_operator.output.volume import free_bytes as free_on_volume

    return free_on_volume(output)


def _passed(
    message: str, prompts: int, *, turns: int | None = None, complete: bool = False, recorded: int | None = None
) -> StepOutcome:
    """`prompts`: the dataset's valid prompts (as every worker's plan counts them, summed), the run's total;
    `turns`: for whole conversations, their planned turns (records per sample); `recorded`: the records an
    existing output holds."""
    check = CheckResult(name=PREFLIGHT, passed=True, total=1, verdict=message)
    return StepOutcome(
        True, Reason.PASSED, message, (check,), prompts=prompts, turns=turns, complete=complete, recorded=recorded
    )


def _failed(reason: str, message: str) -> StepOutcome:
    check = CheckResult(name=PREFLIGHT, passed=False, count=1, total=1, verdict=message)
    return StepOutcome(False, reason, message, (check,))


def build_parser() -> argparse.ArgumentParser:
    """`datagen preflight`'s arguments; what the shells pass is api/commands.py's PreflightCommand."""
    parser = argparse.ArgumentParser(
        prog="datagen preflight", description="Check the dataset, tokenizer and output before a server is launched."
    )
    add_shared_arguments(
        parser,
        PreflightCommand,
        output="the run's output directory (default: spec.output.path)",
        lease_holder="take the output's lease for this run (its UID; output/lease.py)",
    )
    parser.add_argument(
        "--standin",
        action="store_true",
        help="where the tokenizer directory (model.path) does not exist, build the preset's stand-in tokenizer "
        "there, as `datagen run --standin` does (simulator runs only: synthetic data, not model output)",
    )
    return parser


def main(argv: list[str]) -> int:
    import sys

    from datagen_operator.api import SpecError, load_run
    from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_STEP_CRASHED
    from datagen_operator.steps.tokenizer_source import (
        TokenizerUnavailable,
        load_spec_tokenizer,
        missing_tokenizer_dir,
    )

    args = build_parser().parse_args(argv)
    try:
        run = load_run(args.run)
    except (SpecError, FileNotFoundError) as error:
        print(f"{args.run}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    spec = run.spec
    tokenizer_dir = Path(args.tokenizer or spec.model.tokenizer_dir)
    if not tokenizer_dir.is_dir() and args.standin:
        refusal = missing_tokenizer_dir(spec, tokenizer_dir, standin=True)
        if refusal is not None:
            print(f"{args.run}: {refusal}", file=sys.stderr)
            return EXIT_BAD_INPUT
        from datagen_operator.tokenizer.kimi_tiktoken import build_preset_standin

        assert spec.model.preset is not None
        print(f"--standin: building the {spec.model.preset} stand-in tokenizer at {tokenizer_dir}", file=sys.stderr)
        build_preset_standin(spec.model.preset, tokenizer_dir)
    try:
        tokenizer = load_spec_tokenizer(spec, tokenizer_dir, resolve_model(spec).trust_remote_code)
    except TokenizerUnavailable as error:
        # No verdict: a model volume may still be filling (its loader Job copying), so the step's Job runs the
        # preflight again, as after any crash; the one line, not transformers' traceback, is what a person reads.
        print(f"{args.run}: {error}", file=sys.stderr)
        return EXIT_STEP_CRASHED
    outcome = run_preflight(
        spec,
        tokenizer,
        tokenizer_dir,
        Path(args.dataset or spec.dataset.path),
        Path(args.output or spec.output.path),
        holder=lease_holder(args.lease_holder, run),
    )
    return write_verdict(outcome, args.termination_log)
