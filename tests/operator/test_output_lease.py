"""One owner per output on the control plane: a second DataGenRun with the same volume and path (the field case was
two namespaces and identical specs; the lease lives in the volume, so one namespace shows the same) is refused
at its preflight, `OutputInUse` naming the first, before any server; the first generates every prompt once."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from datagen_operator.output.lease import LEASE_FILE
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name


def test_a_second_run_on_one_output_is_refused_before_any_server(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    first, second = new_name("owner"), new_name("intruder")
    output = f"out/{first}"
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        created = runs.create(cluster_run(first, data_dir, standin_tokenizer, output={"path": output}))
        runs.wait(first, "Progressing", "True", "Running", timeout=150)

        runs.create(cluster_run(second, data_dir, standin_tokenizer, output={"path": output}))
        refused = runs.wait(second, "InputsVerified", "False", "OutputInUse", timeout=90)
        assert f"is held by {runs.namespace}/{first}" in refused["message"], refused["message"]
        assert created["metadata"]["uid"] in refused["message"] and " until 20" in refused["message"]
        halted = runs.wait(second, "Succeeded", "False", "PreflightFailed")
        assert "This run does not take the output over by itself" in halted["message"], halted["message"]
        statefulsets = runs.apps.list_namespaced_stateful_set(runs.namespace).items
        assert [s.metadata.name for s in statefulsets] == [f"{first}-server"], "no server for the second run"

        runs.wait(first, "Succeeded", "True", "Completed", timeout=180)
    table = pq.read_table(sorted((data_dir / output / "data").glob("*.parquet")), columns=["id", "run"])
    assert not (data_dir / output / LEASE_FILE).exists(), "the run's last shard gave the lease back"
    ids = table["id"].to_pylist()
    assert len(ids) == len(set(ids)) == 24, "every prompt generated once"
    assert set(table["run"].to_pylist()) == {created["metadata"]["uid"]}, "every record names its run"
