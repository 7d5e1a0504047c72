"""`datagen export` of a run the real worker made against the simulator (stand-in Kimi tokenizer): every
format, exactly once and byte-exact against the store, read back with `datasets`, text re-encoded."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import yaml

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.cli import main as datagen
from datagen_operator.export.manifest import read_export_manifest
from datagen_operator.output.manifest import read_manifest
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import load_tokenizer
from tests.harness.sim import start_sim
from tests.worker.simrun import SIM_FLAGS, prompts, run_inprocess, spec, standin, write_dataset

STOP = 163586


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("simrun")
    items = prompts(12)
    # A multi-turn prompt: the earlier assistant turn is part of the prompt, never of the loss.
    items[1]["messages"] = [
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "And the second?"},
    ]
    output = root / "out"
    document = spec(write_dataset(root / "prompts.jsonl", items), output, **{"generation.samplesPerPrompt": 2})
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as sim:
        assert run_inprocess(document, [sim.url]) == EXIT_OK
    # As `datagen run` leaves it: the manifest beside the data, which is where export finds the tokenizer.
    run = {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "sim"}, "spec": document}
    (output / "run.yaml").write_text(yaml.safe_dump(run))
    return output


def test_each_format_exports_every_record_once_byte_exact(finished_run: Path, tmp_path: Path) -> None:
    import datasets

    records = {(r["id"], r["sample"]): r for r in iter_records(finished_run)}
    assert len(records) == 24
    for export_format in ("speculators", "trl", "text"):
        out = tmp_path / export_format
        assert datagen(["export", str(finished_run), "--format", export_format, "--out", str(out)]) == 0
        manifest = read_export_manifest(out)
        assert manifest["source"]["complete"] is True
        assert manifest["source"]["fingerprint_sha256"] == read_manifest(finished_run)["fingerprint_sha256"]
        assert manifest["counts"]["rows_written"] == 24 and manifest["left_out"] == {}
        if export_format == "trl":
            rows = [
                row for part in sorted((out / "data").glob("part-*.parquet")) for row in pq.read_table(part).to_pylist()
            ]
        else:
            rows = [
                orjson.loads(line)
                for part in sorted((out / "data").glob("part-*.jsonl"))
                for line in part.read_bytes().splitlines()
            ]
        assert sorted((row["id"], row["sample"]) for row in rows) == sorted(records)
        for row in rows:
            record = records[(row["id"], row["sample"])]
            if export_format == "text":
                assert row["roundtrip_ok"] is True, row["id"]
                continue
            assert row["input_ids"] == record["input_ids"] + record["output_ids"]
            assert row["input_ids"][-1] == STOP
            mask = row.get("loss_mask") or row["assistant_masks"]
            assert mask == [0] * len(record["input_ids"]) + [1] * len(record["output_ids"])
        if export_format != "text":
            loader = "parquet" if export_format == "trl" else "json"
            files = str(out / "data" / ("part-*.parquet" if export_format == "trl" else "part-*.jsonl"))
            loaded = datasets.load_dataset(loader, data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
            assert loaded.num_rows == 24


def test_text_rows_decode_to_what_the_tokenizer_reencodes(finished_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "text"
    assert datagen(["export", str(finished_run), "--format", "text", "--out", str(out), "--last-turn-only"]) == 0
    tokenizer = load_tokenizer(standin(), trust_remote_code=False)
    records = {(r["id"], r["sample"]): r for r in iter_records(finished_run)}
    rows = [
        orjson.loads(line)
        for part in sorted((out / "data").glob("part-*.jsonl"))
        for line in part.read_bytes().splitlines()
    ]
    for row in rows:
        record = records[(row["id"], row["sample"])]
        assert tokenizer.encode(row["completion"], add_special_tokens=False) == record["output_ids"]
        assert tokenizer.encode(row["prompt"], add_special_tokens=False) == record["input_ids"]
    assert read_export_manifest(out)["lossy"] is True
