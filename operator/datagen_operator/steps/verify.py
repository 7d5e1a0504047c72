"""`datagen verify OUTPUT_DIR`: every check over a finished (or running) output, as a report a person reads.

Flags are recomputed from the stored token ids (the worker's own flags are not trusted), completeness is
keyed by (id, sample, turn), prompt fidelity re-renders a sample of prompts with the recorded tokenizer and
template (for regenerated conversations every turn of the sampled ones, from the run's own recorded answers),
and the manifest's Parquet checksums are re-hashed. The rules are checks/ (record_pass, completeness, evaluate,
fidelity); this module reads the output and the dataset for them (steps/verify_reads.py) and puts the report
together; the program around it is steps/verify_program.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel, resolve_model
from datagen_operator.api.spec import ChecksSpec, DataGenRunSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.api.words import agrees, plural
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.completeness import (
    KeyCheck,
    SetAside,
    account_set_aside,
    completeness,
    conversations_check,
    key_hashes,
    output_counts,
    turns_cut_causes,
    turns_cut_keys,
)
from datagen_operator.checks.evaluate import check_context, evaluate
from datagen_operator.checks.fidelity import conversation_fidelity, conversations_wanted, line_fidelity, unprovable
from datagen_operator.checks.record_columns import COLUMNS
from datagen_operator.checks.record_pass import Example, PinCheck, RecordsPass, read_records
from datagen_operator.checks.samples import compared_samples, samples_compared
from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from datagen_operator.output.fingerprint import fingerprint_history_reasoning
from datagen_operator.output.layout import Key
from datagen_operator.output.records import TURNS_KIND
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.draws import VariableDraws, variable_draws
from datagen_operator.steps.verify_reads import (
    conversation_records,
    dataset_pin,
    integrity,
    name_examples,
    read_dataset,
)


@dataclass
class VerifyReport:
    output: str
    counts: Counts
    """The whole output's counts, as the run's status.progress holds them: records, server refusals, prompts set
    aside by cause (from rejects.jsonl), requests out of attempts."""
    checks: list[CheckResult]
    examples: list[Example] = field(default_factory=list)
    fingerprint_sha256: str | None = None
    expectations: rc.Expectations | None = None
    """What the records were judged by (where reasoning ends): the HTML report's lengths use the same."""

    @property
    def records(self) -> int:
        return self.counts.records

    @property
    def set_aside(self) -> dict[str, int]:
        """cause -> dataset lines or prompts set aside unsent (listed in rejects.jsonl)."""
        return self.counts.set_aside

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def outcome(self) -> StepOutcome:
        failed = [c for c in self.checks if not c.passed]
        if failed:
            return StepOutcome(
                False,
                Reason.VERIFICATION_FAILED,
                "; ".join(f"{c.name}: {c.verdict}" for c in failed),
                tuple(self.checks),
            )
        return StepOutcome(
            True,
            Reason.VERIFIED,
            f"{plural(len(self.checks), 'check')} {agrees(len(self.checks), 'passes', 'pass')} over {plural(self.records, 'record')}",
            tuple(self.checks),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "passed": self.passed,
            "records": self.records,
            "fingerprint_sha256": self.fingerprint_sha256,
            "checks": [c.model_dump(mode="json") for c in self.checks],
            "examples": [e.__dict__ for e in self.examples],
            "set_aside": dict(self.set_aside),
            "counts": self.counts.for_storage(),
        }


def _loaded_from(tokenizer: Any) -> Path | None:
    """The directory a transformers tokenizer was loaded from (its model directory, for config eos ids)."""
    where = getattr(tokenizer, "name_or_path", None)
    return Path(where) if isinstance(where, str) and where and Path(where).is_dir() else None


@dataclass(frozen=True)
class _JudgedBy:
    """What an output is judged by: its run's spec, or without one what its fingerprint recorded."""

    resolved: ResolvedModel | None
    expect: rc.Expectations
    thinking: bool
    samples: int
    turns_mode: str
    thresholds: ChecksSpec
    draws: VariableDraws | None
    """The template variables drawn for each line: each record is judged by its own draw."""
    compared: int
    """The samples of each prompt compared (checks.samples)."""


def _expectations(
    spec: DataGenRunSpec | None,
    resolved: ResolvedModel | None,
    fingerprint: Mapping[str, Any],
    tokenizer: Any,
    model_dir: Path | None,
) -> rc.Expectations:
    """What faithful records of this run look like; ValueError when nothing says (no spec, no preset)."""
    expect = None
    if resolved is not None and (tokenizer is not None or resolved.preset is not None):
        config_dir = model_dir
        if config_dir is None and spec is not None:
            config_dir = model_config_dir(spec.model.path, _loaded_from(tokenizer))
        expect = rc.expectations_for(resolved, tokenizer, read_model_eos_ids(config_dir))
        if tokenizer is None:
            # No tokenizer to read SGLang's stop set from: every request sent it (the fingerprint's sampling).
            sent = (fingerprint.get("sampling") or {}).get("stop_token_ids") or ()
            stops = expect.stop_token_ids | {i for i in sent if isinstance(i, int)}
            expect = dataclasses.replace(expect, stop_token_ids=stops)
    if expect is None:
        raise ValueError("cannot tell what faithful records look like: pass --run RUN.yaml (and --tokenizer)")
    return expect


def _judged_by(
    spec: DataGenRunSpec | None, fingerprint: Mapping[str, Any], tokenizer: Any, model_dir: Path | None
) -> _JudgedBy:
    resolved: ResolvedModel | None = resolve_model(spec) if spec is not None else None
    thinking = resolved.thinking if resolved else bool(fingerprint.get("thinking"))
    expect = _expectations(spec, resolved, fingerprint, tokenizer, model_dir)
    samples = spec.generation.samples_per_prompt if spec else int(fingerprint.get("samples_per_prompt", 1))
    # The variables drawn are the spec's (OUTPUT/run.yaml's, for `datagen verify OUTPUT`): each record judged by
    # its own draw. The subset is the dataset reference's (its sample): records are wanted for its lines only.
    return _JudgedBy(
        resolved=resolved,
        expect=expect,
        thinking=thinking,
        samples=samples,
        turns_mode=spec.generation.turns if spec else str(fingerprint.get("turns", "last")),
        thresholds=spec.checks if spec else ChecksSpec(),
        draws=variable_draws(spec.generation.template_variable_mix if spec else None),
        compared=compared_samples(spec) if spec else samples_compared(fingerprint.get("sampling") or {}, samples),
    )


@dataclass
class _Accounted:
    """The records' keys against the dataset's, and what stands in for a missing record (rejects.jsonl)."""

    keys: KeyCheck
    server: dict[Key, dict[str, Any]]
    """The server's refusals and failures by key."""
    set_aside: SetAside
    prompts: dict[str, Any] = field(default_factory=dict)
    """id -> Prompt for the fidelity sample's ids (empty without the dataset)."""
    dataset_count: int | None = None
    """The dataset's valid prompts (None without the dataset)."""


def _account(
    output: Path, run: _JudgedBy, read: RecordsPass, rejects: list[dict[str, Any]], dataset: DatasetRef | None
) -> _Accounted:
    from datagen_operator.prompts.scan import ShardScan

    keys = KeyCheck(seen=read.keys)
    server = {
        (r["id"], r.get("sample", 0), r.get("turn") or 0): r
        for r in rejects
        if r.get("kind") == "server" and r.get("id")
    }
    prompts: dict[str, Any] = {}
    dataset_prompts: list[tuple[int, str]] | None = None
    dataset_causes: list[str] | None = None
    dataset_count: int | None = None
    planned: dict[str, int] = {}
    """id -> answers planned, for the prompts set aside unsent."""
    if dataset is not None:
        # Only lines with a rejects.jsonl entry can be set aside; every other valid prompt is just counted.
        reject_lines = {entry.get("line") for entry in rejects if str(entry.get("key", "")).startswith("line:")}
        scan = ShardScan(dataset, 0, 1)
        sampled_ids = {r["id"] for r in read.fidelity_sample}
        scanned = read_dataset(scan, run.samples, reject_lines, sampled_ids, run.turns_mode, run.draws)
        keys.wanted, prompts, planned = scanned.wanted, scanned.sampled, scanned.turns
        dataset_prompts, dataset_causes, dataset_count = scanned.on_reject_lines, scanned.causes, scanned.prompts
    set_aside = account_set_aside(dataset_prompts, dataset_causes, rejects)
    keys.rejected = key_hashes(server)
    keys.unsent = key_hashes(
        [
            *((prompt_id, s, t) for prompt_id in set_aside.prompts for s in range(run.samples)
              for t in range(planned.get(prompt_id, 1))),
            *turns_cut_keys(rejects),
        ]
    )  # fmt: skip
    if keys.wanted is not None:
        name_examples(keys, output, dataset, run.samples, run.turns_mode)
    return _Accounted(keys, server, set_aside, prompts, dataset_count)


def _fidelity(
    output: Path,
    spec: DataGenRunSpec | None,
    run: _JudgedBy,
    read: RecordsPass,
    prompts: dict[str, Any],
    pin: Any,
    tokenizer: Any,
    fingerprint: dict[str, Any],
) -> CheckResult:
    """Prompt fidelity: the sampled records re-rendered (every turn of the sampled conversations under turns: all)."""
    from datagen_operator.prompts.render import Renderer, template_variables

    rendered_on = pin.rendered_on if pin is not None else None
    variables = template_variables(run.resolved, rendered_on) if run.resolved is not None else None
    renderer = Renderer(tokenizer, variables) if tokenizer is not None and variables is not None else None
    # What history the output's requests sent: the run's choice, or the output's own record of it.
    history = spec.generation.history_reasoning if spec else fingerprint_history_reasoning(fingerprint)
    if run.turns_mode == "all":
        # Read only what can be judged: nothing without a tokenizer or a dataset to re-render with.
        cannot = unprovable(None if run.resolved is None or variables is None else renderer, prompts)
        wanted = conversations_wanted(read.fidelity_sample, prompts) if cannot is None else set()
        conversations = conversation_records(output, wanted)
        return conversation_fidelity(conversations, prompts, renderer, run.resolved, variables, history)
    return line_fidelity(read.fidelity_sample, prompts, renderer, history)


def verify_output(
    output: Path,
    spec: DataGenRunSpec | None,
    *,
    tokenizer: Any = None,
    dataset: Path | None = None,
    fidelity: bool = True,
    model_dir: Path | None = None,
) -> VerifyReport:
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.output.readers import RecordBatches, iter_rejects
    from datagen_operator.prompts.pin import read_pin

    manifest = read_manifest(output)
    fingerprint = (manifest or {}).get("fingerprint", {})
    run = _judged_by(spec, fingerprint, tokenizer, model_dir)
    dataset_path = dataset or (Path(spec.dataset.path) if spec else None)
    exists = dataset_path is not None and dataset_path.exists()
    source = DatasetRef.of(spec.dataset if spec else None, dataset_path) if exists else None
    # One streamed pass over the records and one over the dataset; what is kept per record is its key's
    # 64-bit hash (KeyCheck), so memory does not grow with the record's tokens nor with Python objects.
    pin = read_pin(output)
    pins = PinCheck(pin.line_hashes if pin is not None else None)
    read = read_records(
        RecordBatches(output, (*COLUMNS, "cached_tokens", "line", "prompt_hash", "turn")),
        pins,
        run.expect,
        tokenizer,
        fidelity_size=run.thresholds.fidelity_sample if fidelity else 0,
        name_prompts=source is None,
        compared_samples=run.compared,
    )
    rejects = list(iter_rejects(output))
    account = _account(output, run, read, rejects, source)
    if account.dataset_count is None:
        named = read.prompts | {hash(key[0]) for key in account.server} | {hash(i) for i in account.set_aside.prompts}
        prompts_named = len(named)
    else:
        prompts_named = account.dataset_count
    counts = output_counts(read.counts, account.server, prompts_named, account.set_aside)
    ctx = check_context(
        run.resolved, run.thresholds, run.expect.think_end_id, thinking=run.thinking, preset=fingerprint.get("preset")
    )
    checks = [integrity(output, manifest), *evaluate(counts, ctx)]
    cut = turns_cut_causes(rejects)
    checks.append(completeness(account.keys, read.duplicates, account.set_aside, cut))
    if run.turns_mode == "all":
        ended = {(r["id"], r.get("sample", 0)) for r in rejects if r.get("kind") == TURNS_KIND}
        conversations = (account.dataset_count if account.dataset_count is not None else prompts_named) * run.samples
        checks.append(conversations_check(read.by_turn, cut, conversations, len(ended)))
    checks.append(dataset_pin(pin, pins, source))
    if fidelity:
        checks.append(_fidelity(output, spec, run, read, account.prompts, pin, tokenizer, fingerprint))
    flat_examples = [e for flag in sorted(read.examples) for e in read.examples[flag]]
    return VerifyReport(
        str(output), counts, checks, flat_examples, (manifest or {}).get("fingerprint_sha256"), expectations=run.expect
    )
