"""The dataset is pinned to its output: an edit, a deletion or an append is named by line and id, and refused by a
resume's preflight (before any server), by the workers, and by `datagen verify`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson

from datagen_operator.api import load_run
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.pin import pin_changes, pin_dataset, read_pin
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.preflight import run_preflight
from datagen_operator.steps.verify import verify_output
from datagen_operator.steps.verify_reads import DATASET_PIN
from tests.harness.sim import start_sim
from tests.local.runs import FAST_SIM, PROMPTS, datagen_run, manifest
from tests.programs import one_shard_worker, run_program

PARSERS = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "40")


def _copy(path: Path) -> tuple[Path, list[bytes]]:
    lines = [line for line in PROMPTS.read_bytes().splitlines() if line.strip()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, lines


def _edit(path: Path, lines: list[bytes], at: int, appended: int = 0) -> str:
    """Change line `at` (0-based) and append `appended` prompts; the edited prompt's id."""
    edited = orjson.loads(lines[at])
    edited["messages"][-1]["content"] += " (edited)"
    extra = [orjson.dumps({"id": f"new-{i}", "messages": [{"role": "user", "content": "hi"}]}) for i in range(appended)]
    path.write_bytes(b"\n".join([*lines[:at], orjson.dumps(edited), *lines[at + 1 :], *extra]) + b"\n")
    return str(edited["id"])


def test_changes_are_named_by_line_and_id(tmp_path: Path) -> None:
    dataset, lines = _copy(tmp_path / "d.jsonl")
    pinned = pin_dataset(DatasetRef(dataset))
    assert pin_changes(pinned, pin_dataset(DatasetRef(dataset))) is None
    edited_id = _edit(dataset, lines, 2, appended=3)
    changes = pin_changes(pinned, pin_dataset(DatasetRef(dataset)))
    assert changes is not None
    assert f"1 line edited (line 3 (id {edited_id!r}))" in changes
    assert "3 lines appended (line " in changes and "'new-0'" in changes
    dataset.write_bytes(b"\n".join(lines[:-2]) + b"\n")
    assert f"2 lines removed from the end (line {len(lines) - 1}, line {len(lines)})" in (
        pin_changes(pinned, pin_dataset(DatasetRef(dataset))) or ""
    )


def test_a_resume_on_a_changed_dataset_is_refused_by_the_preflight_the_worker_and_verify(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    dataset, lines = _copy(tmp_path / "d.jsonl")
    run_file = manifest(tmp_path, standin_tokenizer, dataset=dataset, **{"clients.shards": 1})
    spec = load_run(run_file).spec
    tokenizer = load_tokenizer(standin_tokenizer, trust_remote_code=False)
    first = run_preflight(spec, tokenizer, standin_tokenizer, dataset, tmp_path / "out")
    assert first.passed and "pinned: sha256" in first.message
    assert read_pin(tmp_path / "out") is not None

    def worker(url: str) -> subprocess.CompletedProcess[str]:
        return run_program(one_shard_worker(run_file, tmp_path / "out", url))

    with start_sim(*PARSERS) as sim:
        assert worker(sim.url).returncode == 0
        edited_id = _edit(dataset, lines, 4, appended=100)
        refused = worker(sim.url)
    assert refused.returncode == 2, refused.stdout + refused.stderr  # bad input: retrying cannot help
    assert f"line 5 (id {edited_id!r})" in refused.stderr + refused.stdout

    outcome = run_preflight(spec, tokenizer, standin_tokenizer, dataset, tmp_path / "out")
    assert not outcome.passed and outcome.reason == "DatasetChanged"
    assert "1 line edited" in outcome.message and "100 lines appended" in outcome.message
    assert "new spec.output.path" in outcome.message

    report = verify_output(tmp_path / "out", spec, tokenizer=tokenizer, dataset=dataset)
    pin_check = next(c for c in report.checks if c.name == DATASET_PIN)
    assert not pin_check.passed and f"id {edited_id!r}" in pin_check.verdict

    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "InputsVerified=False (DatasetChanged)" in " ".join(result.stdout.split())
    assert not (tmp_path / "out" / "logs" / "server-0.log").exists(), "no server may be started"


def test_verify_holds_every_record_to_the_pin(tmp_path: Path, standin_tokenizer: Path) -> None:
    """A record generated from a line edited mid-run (the pin says otherwise) is found by its stored hash, even
    when the file was put back afterwards: every record, not a fidelity sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.checks.test_verify import rewrite_shard

    dataset, _ = _copy(tmp_path / "d.jsonl")
    run_file = manifest(tmp_path, standin_tokenizer, dataset=dataset, **{"clients.shards": 1})
    spec = load_run(run_file).spec
    tokenizer = load_tokenizer(standin_tokenizer, trust_remote_code=False)
    assert run_preflight(spec, tokenizer, standin_tokenizer, dataset, tmp_path / "out").passed
    with start_sim(*PARSERS) as sim:
        done = run_program(one_shard_worker(run_file, tmp_path / "out", sim.url))
    assert done.returncode == 0, done.stdout + done.stderr
    passed = verify_output(tmp_path / "out", spec, tokenizer=tokenizer, dataset=dataset)
    pin_check = next(c for c in passed.checks if c.name == DATASET_PIN)
    assert pin_check.passed and pin_check.total == len(_copy(tmp_path / "again.jsonl")[1])

    def tamper(rows: list[dict]) -> list[dict]:
        rows[3]["prompt_hash"] ^= 1
        return rows

    rewrite_shard(tmp_path / "out", tamper)
    table = pq.read_table(next((tmp_path / "out" / "data").glob("*.parquet")))
    assert table.schema.field("prompt_hash").type == pa.uint64()
    tampered_id = table.column("id")[3].as_py()
    report = verify_output(tmp_path / "out", spec, tokenizer=tokenizer, dataset=dataset)
    pin_check = next(c for c in report.checks if c.name == DATASET_PIN)
    assert not pin_check.passed and pin_check.count == 1
    assert f"1/{pin_check.total} records were generated from prompts that are not the pinned" in pin_check.verdict
    assert repr(tampered_id) in pin_check.verdict


def test_prompts_render_on_the_outputs_pinned_date(tmp_path: Path) -> None:
    """gpt-oss's template writes `Current date:` from `strftime_now`: every stage renders on the date the output
    was pinned, so the canary's and the workers' prompts agree and verify's re-rendering matches on any later
    day (a run across midnight, a verify a week on)."""
    import dataclasses

    from datagen_operator.output.readers import iter_records
    from datagen_operator.prompts.pin import write_pin
    from datagen_operator.tokenizer.standin import ensure_standin

    model = ensure_standin("gpt-oss", tmp_path / "models" / "gpt-oss")
    dataset, _ = _copy(tmp_path / "d.jsonl")
    out = tmp_path / "out"
    write_pin(out, dataclasses.replace(pin_dataset(DatasetRef(dataset)), rendered_on="2020-01-02"))
    run_file = manifest(
        tmp_path, model, dataset=dataset, output=out, **{"model.preset": "gpt-oss", "clients.shards": 1}
    )
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr  # verify re-rendered every sampled prompt alike
    tokenizer = load_tokenizer(model, trust_remote_code=False)
    stored = [tokenizer.decode(record["input_ids"]) for record in iter_records(out)]
    canary = [orjson.loads(line) for line in (out / "canary.jsonl").read_bytes().splitlines()]
    rendered = stored + [tokenizer.decode(r["input_ids"]) for r in canary if "input_ids" in r]
    assert rendered and all("Current date: 2020-01-02" in text for text in rendered)
    assert read_pin(out).rendered_on == "2020-01-02"  # type: ignore[union-attr]
