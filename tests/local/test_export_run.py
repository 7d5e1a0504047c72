"""`datagen run` with spec.export on the simulator: after the final verification, each format holds every
record exactly once, with the stored token ids."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from tests.local.runs import FAST_SIM, datagen_run, manifest, stored_keys


def test_a_run_with_spec_export_writes_each_record_once_in_each_format(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(
        tmp_path, standin_tokenizer, **{"export": {"formats": ["speculators", "trl"], "path": "for-training"}}
    )
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Exported=True" in result.stdout and "Succeeded=True" in result.stdout
    out = tmp_path / "out"
    keys = stored_keys(out)
    assert keys and len(set(keys)) == len(keys)
    stored = {}
    for path in sorted((out / "data").glob("shard-*.parquet")):
        table = pq.read_table(path, columns=["id", "sample", "input_ids", "output_ids"]).to_pylist()
        stored.update({(r["id"], r["sample"]): r["input_ids"] + r["output_ids"] for r in table})
    root = out / "for-training"

    rows = [
        orjson.loads(line)
        for p in sorted((root / "speculators" / "data").glob("*.jsonl"))
        for line in p.read_bytes().splitlines()
    ]
    assert sorted((r["id"], r["sample"]) for r in rows) == sorted(keys)
    assert all(r["input_ids"] == stored[(r["id"], r["sample"])] for r in rows)
    assert orjson.loads((root / "speculators" / "export-manifest.json").read_bytes())["counts"]["rows_written"] == len(
        keys
    )

    trl = [row for p in sorted((root / "trl" / "data").glob("*.parquet")) for row in pq.read_table(p).to_pylist()]
    assert sorted((r["id"], r["sample"]) for r in trl) == sorted(keys)
    assert all(r["input_ids"] == stored[(r["id"], r["sample"])] for r in trl)
