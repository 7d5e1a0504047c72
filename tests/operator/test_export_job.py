"""spec.export on the real control plane: after the verify Job passes, the export Job writes each record once
into the output volume and its verdict reaches the Exported condition and Succeeded."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name


def test_export_job_after_verification_writes_each_record_once(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("export")
    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"export.formats": ["speculators"]}))
        exported = runs.wait(name, "Exported", "True", "Exported", timeout=240)
        runs.wait(name, "Succeeded", "True", "Completed", timeout=30)
    assert "speculators: 24 rows" in exported["message"]
    assert runs.condition(name, "DataFaithful")["status"] == "True"  # type: ignore[index]
    assert runs.job(f"{name}-export") is not None
    output = data_dir / "out" / name
    keys = sorted(
        key
        for path in sorted((output / "data").glob("shard-*.parquet"))
        for key in zip(*pq.read_table(path, columns=["id", "sample"]).to_pydict().values(), strict=True)
    )
    parts = sorted((output / "export" / "speculators" / "data").glob("*.jsonl"))
    rows = [orjson.loads(line) for part in parts for line in part.read_bytes().splitlines()]
    assert len(keys) == 24 and sorted((r["id"], r["sample"]) for r in rows) == keys
