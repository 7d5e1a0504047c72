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
import io
import random
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
from datagen_operator.checks.render_pass import DatasetLines, RenderedStore, judge_dataset
from datagen_operator.checks.samples import compared_samples
from datagen_operator.checks.server_truth import external_server_flags
from datagen_operator.engine.model_configs import model_config_dir
from datagen_operator.engine.requests import run_sampling
from datagen_operator.output.layout import FILE_BLOCK, OutputLayout, bookkeeping_bytes
from datagen_operator.output.lease import (
    STEP_MARGIN_S,
    STEP_PREFLIGHT,
    Holder,
    OutputInUse,
    claim_output,
    lease_holder,
    release_lease,
)
from datagen_operator.output.records import ContextLimit, model_context_limit
from datagen_operator.output.volume import is_volume_error

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
    from datagen_operator.output.rendered import render_identity
    from datagen_operator.prompts.dataset import DatasetError, ShardScan, check_lines
    from datagen_operator.prompts.pin import LinePins, changed_message, pin_dataset, render_date
    from datagen_operator.prompts.render import Renderer, template_variables

    resolved = resolve_model(spec)
    expect = rc.expectations_for(resolved, tokenizer, model_config_dir(spec.model.path, tokenizer_dir))
    rendered_on = render_date(output)
    variables = template_variables(resolved, rendered_on)
    renderer = Renderer(tokenizer, variables)
    model_dir = Path(spec.model.path) if (Path(spec.model.path) / "config.json").is_file() else tokenizer_dir
    limit = model_context_limit(_read_config(model_dir), spec.server.extra_args)
    store = RenderedStore.begin(output)
    try:
        scan = ShardScan(dataset, 0, 1, spec.dataset.format, id_field=spec.dataset.id_field, sample=spec.dataset.sample)
        # A JSONL dataset is pinned by the very read that renders it; other formats by a read of their own.
        pins = LinePins(dataset, rendered_on, spec.dataset.id_field) if scan.format == "jsonl" else None
        scan.lines = pins
        lines = render_dataset(spec, scan, renderer, variables, tokenizer_dir, resolved.trust_remote_code, limit, store)
        check_lines(scan, lines.prompts, lines.malformed)  # raises EmptyDataset or UnknownDatasetShape, naming why
    except (DatasetError, OSError) as error:  # EmptyDataset is one
        store.abandon()
        said = str(error) if isinstance(error, DatasetError) else f"{error.strerror or error}"
        named = said if said.startswith("spec.dataset.path") else f"spec.dataset.path {dataset}: {said}"
        return _failed(Reason.DATASET_UNUSABLE, named)
    pin = pins.pin() if pins is not None else pin_dataset(dataset, spec.dataset.format, id_field=spec.dataset.id_field)
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
        store.finish(pin, identity)
    else:
        store.abandon()
    return outcome


def _judge_rendered(
    spec: DataGenRunSpec, expect: rc.Expectations, renderer: Any, lines: DatasetLines, pin: Any, dataset: Path,
    output: Path, tokenizer_dir: Path, subset: str = "",
) -> StepOutcome:  # fmt: skip
    """The verdicts after the pass over the dataset: its lines, the pin, the room, an existing output. `subset`:
    what dataset.sample keeps, said."""
    from datagen_operator.output.fingerprint import (
        build_fingerprint,
        chat_template_sha256,
        prelaunch_changes,
        tokenizer_fingerprint,
    )
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.pin import changed_message, pin_changes, read_pin, write_pin

    resolved = resolve_model(spec)
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
    passed = partial(_passed, turns=lines.turns if spec.generation.turns == "all" else None)
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
        return passed(f"{found} (pinned: sha256 {pin.sha256[:12]}); {output} is new", lines.prompts)
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
    changes = prelaunch_changes(manifest.get("fingerprint", {}), current)
    if changes:
        return _failed(
            Reason.FINGERPRINT_MISMATCH,
            f"{output} was generated with a different fingerprint; changed: {'; '.join(changes)}. Resume with the "
            "same tokenizer, template and generation settings, or write to a new spec.output.path",
        )
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
    if pinned is None:
        write_pin(output, pin)  # an output started before datasets were pinned: pinned from now on
    planned = lines.turns if spec.generation.turns == "all" else lines.prompts
    if output_complete(manifest, planned * spec.generation.samples_per_prompt):
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
    """The pass over the dataset (checks/render_pass.py) with the workers' render helpers, one per core the pod
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
    done = sum(int(counts.get(key) or 0) for key in ("records", "rejected", "set_aside_records"))
    shards = int(manifest.get("shard_count") or 0)
    return shards > 0 and int(counts.get("shards_complete") or 0) >= shards and done >= wanted


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
    from datagen_operator.checks.verify import stored_record_counts

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


# --- the output volume -----------------------------------------------------------------------------

MEASURE_TOKENS = 512
"""Output length of the long synthetic records (bytes per output token is the slope between 1 and this)."""


@dataclass(frozen=True)
class OutputEstimate:
    """What the rest of the run writes, per record, measured on this dataset's tokens."""

    records: int
    """Records still to write (the dataset's prompts x samples, less what the output already holds)."""
    shards: int
    min_tokens: int
    """Output tokens of the shortest answer (1, or min_new_tokens)."""
    max_tokens: int
    segment_min: float
    """Segment bytes of a record of mean prompt length and min_tokens."""
    segment_per_token: float
    """Segment bytes of each further output token."""
    parquet_min: float
    parquet_per_token: float
    mean_prompt_tokens: float
    files: int = 0
    """The run's small files written after this check (manifest, dataset pin), a block each at least."""

    @property
    def bytes_per_output_token(self) -> float:
        return self.segment_per_token

    def _peak(self, tokens: int) -> int:
        """The most on disk at once: every segment plus the shards' reserves at the end of generation, or
        every segment plus the Parquet while compacting (the reserve is freed for it)."""
        from datagen_operator.output.writer import RESERVE_BYTES

        extra = tokens - self.min_tokens
        segments = self.records * (self.segment_min + extra * self.segment_per_token)
        parquet = self.records * (self.parquet_min + extra * self.parquet_per_token)
        return int(segments + max(self.shards * RESERVE_BYTES, parquet)) + self.files

    @property
    def lower(self) -> int:
        return self._peak(self.min_tokens)

    @property
    def upper(self) -> int:
        return self._peak(self.max_tokens)


def _record_bytes(input_ids: list[int], outputs: list[list[int]]) -> tuple[float, float]:
    """Mean (segment line bytes, Parquet row bytes) of records as the worker stores them, one per output
    (a batch: one Parquet row alone would be all file overhead, and equal rows would compress to nothing)."""
    import pyarrow.parquet as pq

    from datagen_operator.output.parquet import PARQUET_WRITE_OPTIONS, ColumnBatch
    from datagen_operator.output.records import Answer, Job, build_record, encode_record

    segment = 0
    batch = ColumnBatch()
    for index, output_ids in enumerate(outputs):
        meta = {"finish_reason": {"type": "stop", "matched": output_ids[-1]}, "prompt_tokens": len(input_ids),
                "completion_tokens": len(output_ids), "cached_tokens": 0}  # fmt: skip
        job = Job(index, f"prompt-{index:09d}", 0, input_ids, False, 2**63 + index)
        answer = Answer(output_ids, meta, "http://10.0.0.1:30000", 1, 12.3456)
        record = build_record(job, answer, frozenset(), "5f1c2b9e-7a41-4d2e-9c3b-1e8f0a6d4c27")  # a run UID
        segment += len(encode_record(record))
        batch.add(record)
    buffer = io.BytesIO()
    pq.write_table(batch.table(), buffer, **PARQUET_WRITE_OPTIONS)
    return segment / len(outputs), len(buffer.getvalue()) / len(outputs)


def estimate_output(spec: DataGenRunSpec, lines: DatasetLines, manifest: dict[str, Any] | None) -> OutputEstimate:
    """Synthetic records made of the dataset's own rendered prompts (a sample of the pass's, output ids drawn from
    the same mix), measured with the worker's encoder and the Parquet writer, sized at the mean prompt length."""
    rendered = [ids for ids in lines.sample if ids] or [[0]]
    pool = [token for ids in rendered for token in ids]
    mean_prompt = lines.mean_prompt_tokens or sum(map(len, rendered)) / len(rendered)
    prompt_ids = min(rendered, key=lambda ids: abs(len(ids) - mean_prompt))
    sampling = spec.generation.sampling
    min_tokens = max(1, sampling.min_new_tokens or 1)
    rng = random.Random(0)
    rows = 32
    short = _record_bytes(prompt_ids, [rng.choices(pool, k=min_tokens) for _ in range(rows)])
    long = _record_bytes(prompt_ids, [rng.choices(pool, k=min_tokens + MEASURE_TOKENS) for _ in range(rows)])
    segment_per_token = (long[0] - short[0]) / MEASURE_TOKENS
    parquet_per_token = (long[1] - short[1]) / MEASURE_TOKENS
    # The records are sized at the mean prompt length, not the chosen prompt's.
    offset = mean_prompt - len(prompt_ids)
    done = 0
    if manifest is not None:
        counts = manifest.get("counts") or {}
        done = int(counts.get("records", 0)) + int(counts.get("rejected", 0))
    samples = spec.generation.samples_per_prompt
    return OutputEstimate(
        records=max(0, lines.prompts * samples - done),
        shards=spec.clients.shards,
        min_tokens=min_tokens,
        max_tokens=max(min_tokens, sampling.max_new_tokens),
        segment_min=max(1.0, short[0] + offset * segment_per_token),
        segment_per_token=segment_per_token,
        parquet_min=max(1.0, short[1] + offset * parquet_per_token),
        parquet_per_token=parquet_per_token,
        mean_prompt_tokens=mean_prompt,
        files=bookkeeping_bytes(lines.lines_total) + rendered_bytes(lines),
    )


def rendered_bytes(lines: DatasetLines) -> int:
    """What the rendered store takes on the output volume (output/rendered.py): part of the output, so part of
    its room."""
    from datagen_operator.output.rendered import LINE_DTYPE

    return 4 * lines.rendered_tokens + LINE_DTYPE.itemsize * lines.lines_total + FILE_BLOCK


def estimate_for(spec: DataGenRunSpec, tokenizer: Any, tokenizer_dir: Path) -> OutputEstimate:
    """The preflight's estimate of what `spec`'s output will take, on its own (rendered inline, nothing stored)."""
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.dataset import ShardScan
    from datagen_operator.prompts.render import Renderer, template_variables

    variables = template_variables(resolve_model(spec))
    renderer = Renderer(tokenizer, variables)
    scan = ShardScan(
        spec.dataset.path, 0, 1, spec.dataset.format, id_field=spec.dataset.id_field, sample=spec.dataset.sample
    )
    lines = render_dataset(
        spec, scan, renderer, variables, tokenizer_dir, False, ContextLimit(None, None), RenderedStore(None), 0
    )
    return estimate_output(spec, lines, read_manifest(Path(spec.output.path)))


@dataclass(frozen=True)
class RoomVerdict:
    passed: bool
    message: str


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def room_verdict(estimate: OutputEstimate, output: Path, free: int | None) -> RoomVerdict:
    """Refuse when even the least the rest of the run writes cannot fit; warn when the most cannot."""
    if free is None or estimate.records == 0:
        return RoomVerdict(True, "")
    e = estimate
    basis = (
        f"{e.records} records x ({e.mean_prompt_tokens:.0f} prompt + {e.min_tokens}..{e.max_tokens} output tokens), at "
        f"{e.segment_per_token:.1f} bytes per token in segments, {e.parquet_per_token:.1f} in Parquet"
    )
    if free < e.lower:
        return RoomVerdict(
            False,
            f"{output} has {_size(free)} free; the output needs at least {_size(e.lower)} and up to {_size(e.upper)} "
            f"({basis}). Free space or grow the volume, or write to a larger spec.output.path",
        )
    if free < e.upper:
        return RoomVerdict(
            True,
            f"warning: {output} has {_size(free)} free; the output needs {_size(e.lower)} to {_size(e.upper)} "
            f"({basis}): it may fill up (the run then stops and resumes once the volume grows)",
        )
    return RoomVerdict(True, f"{output} has {_size(free)} free for at most {_size(e.upper)} of output")


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
    from datagen_operator.checks.tokenizer_source import (
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
