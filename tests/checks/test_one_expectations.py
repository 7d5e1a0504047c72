"""One expectations source: the canary, the worker (whose flags the rolling checks count), a resume's preflight and
`datagen verify` judge the same records with the same stop set and give identical flags; the stop set is SGLang's
union. (`datagen export` reads the stored flags: it judges nothing again.)

The model is the Kimi-K2 stand-in run with no preset and the right parsers: its tokenizer's eos (`[EOS]`) is not
its config's eos (`<|im_end|>`), the case where the canary passed and verify then refused every record.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api import load_run
from datagen_operator.api.flags import NAN_REPLACED
from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.resolve import resolve_model
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import TERMINATION, check_context, evaluate
from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.canary import run_canary
from datagen_operator.steps.preflight import judge_existing_records
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import DELETE, local_run, write_run
from tests.programs import one_shard_worker, run_program

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts" / "quickstart.jsonl"
KIMI_PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "40")
NO_PRESET = {
    "model.preset": DELETE,
    "model.trustRemoteCode": True,
    "server.reasoningParser": "kimi_k2",
    "server.toolCallParser": "kimi_k2",
    "generation.sampling.max_new_tokens": 4096,
    "clients.shards": 1,
    "clients.concurrency": 8,
    "checks.canaryPrompts": 4,
}


def test_the_stop_set_is_sglangs_union() -> None:
    """config.json + generation_config.json eos, the tokenizer's eos, its additional stop tokens, the preset's."""
    kimi = ensure_standin_tokenizer()
    tokenizer = load_tokenizer(kimi, trust_remote_code=True)
    spec = load_run_document(local_run(kimi, PROMPTS, Path("/nonexistent"), **NO_PRESET))
    expect = rc.expectations_for(resolve_model(spec), tokenizer, read_model_eos_ids(kimi))
    im_end, eos = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id
    assert eos != im_end  # the case: the tokenizer's eos `[EOS]` is not the config's
    assert expect.stop_token_ids == {im_end, eos}
    # SGLang's additional stop tokens count when the vocabulary has them (a tokenizer that names one).
    extra = _WithAddedVocab(tokenizer, {"<|eom_id|>": 7})
    assert 7 in rc.expectations_for(resolve_model(spec), extra, read_model_eos_ids(kimi)).stop_token_ids
    # Without a tokenizer (verify of an output alone), the preset's fixed ids: never an empty set for a preset.
    with_preset = load_run_document(local_run(kimi, PROMPTS, Path("/nonexistent"))).model_copy()
    assert rc.expectations_for(resolve_model(with_preset), None, ()).stop_token_ids


def test_the_models_configs_count_from_the_model_directory_when_the_tokenizer_lives_elsewhere(tmp_path: Path) -> None:
    """SGLang reads config.json and generation_config.json from --model-path and the tokenizer from
    --tokenizer-path (model.tokenizerPath): a stop on an eos id only the model's configs list is a stop, not a
    bad termination; the tokenizer directory's configs are not SGLang's."""
    kimi = ensure_standin_tokenizer()
    tokenizer = load_tokenizer(kimi, trust_remote_code=True)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "deepseek_v3", "eos_token_id": 11}')
    (model_dir / "generation_config.json").write_text('{"eos_token_id": [12, 13]}')
    spec = load_run_document(
        local_run(model_dir, PROMPTS, Path("/nonexistent"), **NO_PRESET, **{"model.tokenizerPath": str(kimi)})
    )
    config_dir = model_config_dir(spec.model.path, spec.model.tokenizer_dir)
    assert config_dir == model_dir
    expect = rc.expectations_for(resolve_model(spec), tokenizer, read_model_eos_ids(config_dir))
    # Not the tokenizer folder's config eos (<|im_end|>): SGLang never reads that file.
    assert expect.stop_token_ids == {11, 12, 13, tokenizer.eos_token_id} and im_end not in expect.stop_token_ids
    answer = [*expect.think_start_ids, 5000, expect.think_end_id, 5001, 12]
    assert rc.inspect_record([1, 2], answer, {"type": "stop", "matched": 12}, len(answer), False, expect) == set()
    # A model directory not readable here (verify away from the model): the tokenizer's folder, as before.
    assert model_config_dir(tmp_path / "elsewhere", kimi) == kimi


class _WithAddedVocab:
    def __init__(self, tokenizer: Any, added: dict[str, int]) -> None:
        self._tokenizer, self._added = tokenizer, added

    def get_added_vocab(self) -> dict[str, int]:
        return {**self._tokenizer.get_added_vocab(), **self._added}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def load_run_document(document: dict[str, Any]) -> Any:
    from datagen_operator.api import parse_run

    return parse_run(document).spec


@pytest.mark.parametrize("nan_rate", ["0", "0.3"])
def test_canary_worker_rolling_and_verify_flag_the_same_records(tmp_path: Path, nan_rate: str) -> None:
    kimi = ensure_standin_tokenizer()
    run_file = write_run(tmp_path / "run.yaml", local_run(kimi, PROMPTS, tmp_path / "out", name="one", **NO_PRESET))
    spec = load_run(run_file).spec
    tokenizer = load_tokenizer(kimi, trust_remote_code=True)
    expect = rc.expectations_for(resolve_model(spec), tokenizer, read_model_eos_ids(kimi))
    with start_sim(*KIMI_PARSERS, "--sim-fault-nan-rate", nan_rate) as sim:
        canary = asyncio.run(run_canary(spec, tokenizer, PROMPTS, [sim.url], tmp_path / "canary.jsonl", kimi))
        worker = run_program(one_shard_worker(run_file, tmp_path / "out", sim.url))
    assert worker.returncode == 0, worker.stdout + worker.stderr

    canary_records = [orjson.loads(line) for line in (tmp_path / "canary.jsonl").read_bytes().splitlines()]
    canary_records = [r for r in canary_records if "output_ids" in r]
    stored = list(iter_records(tmp_path / "out"))
    assert canary_records and stored
    # Each stage's flags are what the one rule gives under the one expectations source.
    for record in [*canary_records, *stored]:
        again = rc.inspect_record(
            record["input_ids"], record["output_ids"], record["finish_reason"], record["completion_tokens"],
            bool(record.get("has_tools")), expect,
        )  # fmt: skip
        assert set(record["flags"]) == again, record["id"]
    worker_counts = Counter(flag for record in stored for flag in record["flags"])

    # The rolling checks count the worker's published counters; verify recomputes from the stored ids.
    progress = ShardProgress.from_storage((tmp_path / "out" / "shards" / "00000" / "progress.json").read_bytes())
    assert Counter({k: v for k, v in progress.counts.flags.items() if v}) == worker_counts
    report = verify_output(tmp_path / "out", spec, tokenizer=tokenizer, dataset=PROMPTS)
    verify_termination = next(c for c in report.checks if c.name == TERMINATION)
    rolling = evaluate(progress.counts, check_context(resolve_model(spec), spec.checks, expect.think_end_id))
    rolling_termination = next(c for c in rolling if c.name == TERMINATION)
    # A resume's preflight recomputes the flags from the stored ids and judges them by the same thresholds.
    existing = judge_existing_records(tmp_path / "out", expect, check_context(resolve_model(spec), spec.checks, None))
    assert existing.records == len(stored)
    preflight_termination = next(c for c in existing.checks if c.name == TERMINATION)
    assert (preflight_termination.passed, preflight_termination.count) == (
        rolling_termination.passed,
        rolling_termination.count,
    )
    nan = worker_counts[NAN_REPLACED]
    canary_nan = sum(NAN_REPLACED in r["flags"] for r in canary_records)
    if nan_rate == "0":
        assert nan == canary_nan == 0
        assert canary.passed, canary.message
        assert verify_termination.passed and rolling_termination.passed, verify_termination.verdict
        assert report.passed, [c.verdict for c in report.checks if not c.passed]
    else:
        assert nan > 0 and canary_nan > 0  # the simulator's NaN guard fired in both
        assert not canary.passed and "NaN" in canary.message
        for check in (verify_termination, rolling_termination):
            assert not check.passed and check.count == nan and "NaN happened" in check.verdict
