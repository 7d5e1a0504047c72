"""dataset.sample: a seeded subset of the dataset, drawn by each line's id (not its position, not the shard count),
recorded exactly, resumed without another line, verified as the subset, and fingerprinted so another sample on
the same output is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.errors import SpecError
from datagen_operator.api.exit_codes import EXIT_FINGERPRINT_MISMATCH, EXIT_OK
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.lines import MalformedLine
from datagen_operator.prompts.scan import ShardScan
from datagen_operator.steps.preflight import run_preflight
from datagen_operator.steps.verify import verify_output
from tests.harness.sim import start_sim
from tests.worker.simrun import (
    SIM_FLAGS,
    check_records,
    kill_9_after_records,
    progress,
    prompts,
    raw_segment_keys,
    reference_renderer,
    run_inprocess,
    spec,
    standin,
    write_dataset,
)
from tests.worker.test_worker_crash import PACED

COUNT = 25
SAMPLE = {"count": COUNT, "seed": 3}


def _ids(path: Path, shards: int, sample: dict[str, Any] | None) -> set[str]:
    """The prompt ids every shard's scan yields, together (the subset's lines as the workers read them)."""
    from datagen_operator.api.generation_spec import DatasetSample

    drawn = DatasetSample.model_validate(sample) if sample is not None else None
    return {
        item[0].id
        for shard in range(shards)
        for item in ShardScan(DatasetRef(path, sample=drawn), shard, shards)
        if not isinstance(item, MalformedLine)
    }


def test_a_fraction_keeps_the_same_lines_whatever_the_order_of_the_file_and_the_shard_count(tmp_path: Path) -> None:
    items = prompts(400, tools_every=0)
    forward = write_dataset(tmp_path / "forward.jsonl", items)
    backward = write_dataset(tmp_path / "backward.jsonl", items[::-1])
    sample = {"fraction": 0.3, "seed": 11}
    kept = _ids(forward, 1, sample)
    assert 90 <= len(kept) <= 150, len(kept)  # about 120 of 400
    assert _ids(forward, 3, sample) == kept
    assert _ids(backward, 2, sample) == kept
    assert _ids(forward, 1, {**sample, "seed": 12}) != kept  # another seed, another subset
    assert _ids(forward, 1, {"fraction": 1}) == {item["id"] for item in items}
    counted = _ids(backward, 4, SAMPLE)
    assert len(counted) == COUNT and counted == _ids(forward, 1, SAMPLE)
    assert counted != {item["id"] for item in items[:COUNT]}  # drawn, not the file's first lines


def test_a_subset_run_records_its_lines_only_resumes_after_kill_9_and_verifies_as_the_subset(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    items = prompts(90)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items, extra_lines={40: b"{not json"})
    subset = _ids(dataset, 1, SAMPLE)
    wanted = [item for item in items if item["id"] in subset]
    output, log = tmp_path / "out", tmp_path / "worker.log"
    document = spec(dataset, output, **{"dataset.sample": SAMPLE, "generation.samplesPerPrompt": 2})
    with start_sim(*SIM_FLAGS, *PACED, "--sim-tokens-per-s", "200", tokenizer_dir=standin()) as server:
        kill_9_after_records(document, server.url, log, at_least=5)
        interrupted = set(raw_segment_keys(output))
        assert 0 < len(interrupted) < 2 * COUNT, len(interrupted)
        assert {key[0] for key in interrupted} <= subset
        assert run_inprocess(document, [server.url], "--no-compact") == EXIT_OK
        counts = raw_segment_keys(output)
        assert [key for key, n in counts.items() if n > 1] == []
        assert set(counts) == {(prompt_id, s, 0) for prompt_id in subset for s in range(2)}
        assert run_inprocess(document, [server.url]) == EXIT_OK  # compaction

        # Another output of the same sample with three shards records the same lines.
        three = spec(dataset, tmp_path / "three", **{"dataset.sample": SAMPLE, "clients.shards": 3})
        for shard in range(3):
            assert run_inprocess(three, [server.url], "--shard-index", str(shard), "--shard-count", "3") == EXIT_OK
        assert {r["id"] for r in iter_records(tmp_path / "three")} == subset

        # Another sample into this output: refused, naming the field.
        other = spec(dataset, output, **{"dataset.sample": {**SAMPLE, "count": COUNT + 5}})
        capfd.readouterr()
        assert run_inprocess(other, [server.url]) == EXIT_FINGERPRINT_MISMATCH
        assert "dataset.sample.count: 25 -> 30" in capfd.readouterr().err
    check_records(output, wanted, samples=2)
    state = progress(output)
    assert (state["records_done"], state["records_total"], state["prompts_total"]) == (2 * COUNT, 2 * COUNT, COUNT)

    report = verify_output(output, parse_spec(document), tokenizer=reference_renderer().tokenizer, dataset=dataset)
    assert report.passed, [c.verdict for c in report.checks if not c.passed]
    # Lines: the subset's prompts, and the bad line only where its own draw (by its line key) keeps it.
    assert report.counts.records == 2 * COUNT and report.counts.lines == COUNT + _set_aside(dataset), report.counts


def _set_aside(path: Path) -> int:
    from datagen_operator.api.generation_spec import DatasetSample

    drawn = DatasetSample.model_validate(SAMPLE)
    return sum(isinstance(item, MalformedLine) for item in ShardScan(DatasetRef(path, sample=drawn), 0, 1))


def test_the_preflight_counts_the_subset_and_refuses_another_sample_on_the_output(tmp_path: Path) -> None:
    from datagen_operator.prompts.render import load_tokenizer

    items = prompts(60, tools_every=0)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    tokenizer = load_tokenizer(standin(), trust_remote_code=False)

    def preflight(sample: dict[str, Any]) -> Any:
        document = spec(dataset, output, **{"dataset.sample": sample})
        return run_preflight(parse_spec(document), tokenizer, standin(), dataset, output)

    first = preflight({"count": 10, "seed": 1})
    assert first.passed and first.prompts == 10, first.message
    assert "10 of 60 prompts, seed 1" in first.message
    whole = preflight({"count": 500})
    assert whole.passed and whole.prompts == 60
    assert (
        "dataset.sample.count 500 is not below the dataset's 60 valid prompts: every prompt is taken" in whole.message
    )
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        document = spec(dataset, output, **{"dataset.sample": {"count": 10, "seed": 1}})
        assert run_inprocess(document, [server.url]) == EXIT_OK
    assert len(list(iter_records(output))) == 10
    again = preflight({"count": 10, "seed": 1})
    assert again.passed, again.message
    refused = preflight({"count": 10, "seed": 2})
    assert not refused.passed and refused.reason == "FingerprintMismatch"
    assert "dataset.sample.seed: 1 -> 2" in refused.message, refused.message
    pin = orjson.loads((output / "dataset.pin.json").read_bytes())
    assert pin["lines"] == 60  # the pin is the whole dataset's


@pytest.mark.parametrize(
    ("sample", "field", "words"),
    [
        ({"count": 3, "fraction": 0.5}, "spec.dataset.sample", "set exactly one of count, fraction"),
        ({"seed": 4}, "spec.dataset.sample", "set exactly one of count, fraction"),
        ({"fraction": 0}, "spec.dataset.sample.fraction", "greater than 0"),
        ({"fraction": 1.5}, "spec.dataset.sample.fraction", "less than or equal to 1"),
        ({"count": 0}, "spec.dataset.sample.count", "greater than or equal to 1"),
        ({"count": 5, "seed": -1}, "spec.dataset.sample.seed", "greater than or equal to 0"),
    ],
)
def test_a_bad_sample_is_refused_naming_the_field(sample: dict[str, Any], field: str, words: str) -> None:
    document = spec(Path("/d.jsonl"), Path("/out"), **{"dataset.sample": sample})
    with pytest.raises(SpecError) as refused:
        parse_spec(document)
    assert [e.field for e in refused.value.errors] == [field]
    assert words in str(refused.value)
