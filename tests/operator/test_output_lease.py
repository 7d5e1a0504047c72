"""One owner per output on the control plane: a second DataGenRun with the same volume and path (the field case was
two namespaces and identical specs; the lease lives in the volume, so one namespace shows the same) is refused
at its preflight, `OutputInUse` naming the first, before any server; the first generates every prompt once."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from datagen_operator.output.layout import OutputLayout
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
        created = runs.create(cluster_run(first, data_dir, standin_tokenizer, **{"output.path": output}))
        runs.wait(first, "Progressing", "True", "Running", timeout=150)

        runs.create(cluster_run(second, data_dir, standin_tokenizer, **{"output.path": output}))
        refused = runs.wait(second, "InputsVerified", "False", "OutputInUse", timeout=90)
        assert f"is held by {runs.namespace}/{first}" in refused["message"], refused["message"]
        assert created["metadata"]["uid"] in refused["message"] and " until 20" in refused["message"]
        # What the holder is doing, from the lease: its workers took it over from its preflight.
        assert "its workers are generating" in refused["message"], refused["message"]
        halted = runs.wait(second, "Succeeded", "False", "PreflightFailed")
        # How this one starts again, in a command that does it: nothing retries a halted run's preflight.
        restart = f"`kubectl delete datagenrun -n {runs.namespace} {second}`, then apply its manifest again"
        assert "does not retry by itself" in halted["message"] and restart in halted["message"], halted["message"]
        statefulsets = runs.apps.list_namespaced_stateful_set(runs.namespace).items
        assert [s.metadata.name for s in statefulsets] == [f"{first}-server"], "no server for the second run"

        runs.wait(first, "Succeeded", "True", "Completed", timeout=180)
    table = pq.read_table(sorted((data_dir / output / "data").glob("*.parquet")), columns=["id", "run"])
    assert not OutputLayout(data_dir / output).lease.exists(), "the run's last shard gave the lease back"
    ids = table["id"].to_pylist()
    assert len(ids) == len(set(ids)) == 24, "every prompt generated once"
    assert set(table["run"].to_pylist()) == {created["metadata"]["uid"]}, "every record names its run"


def test_a_run_halted_at_the_parser_check_gives_its_lease_back_once(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    """The preflight's lease lasts the server's startup budget plus 30 minutes (the canary takes it next). A
    halt at the parser check has no pod left to give it back: before, a second run on that output (the same
    run re-created with the fix) was refused OutputInUse for over an hour. Now one small Job gives it back."""
    halted, after = new_name("halted"), new_name("after")
    output = f"out/{halted}"
    lease = OutputLayout(data_dir / output).lease
    with start_sim(
        "--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", tokenizer_dir=standin_tokenizer
    ) as sim:  # the wrong reasoning parser: every run on it halts ParsersMismatch
        operator([sim.url])
        created = runs.create(cluster_run(halted, data_dir, standin_tokenizer, **{"output.path": output}))
        runs.wait(halted, "Succeeded", "False", "ParsersMismatch", timeout=90)
        runs.wait_for("the halted run's lease given back", lambda: not lease.exists(), 60)
        job = runs.batch.read_namespaced_job(f"{halted}-release", runs.namespace)
        assert job.metadata.owner_references[0].uid == created["metadata"]["uid"], "deleted with its run"

        # Another run on the output is not refused; it takes the lease and, halted the same way, gives it back.
        runs.create(cluster_run(after, data_dir, standin_tokenizer, **{"output.path": output}))
        verified = runs.wait(after, "InputsVerified", "True", timeout=90)
        assert "held by" not in verified["message"], verified["message"]
        runs.wait(after, "Succeeded", "False", "ParsersMismatch", timeout=90)
        runs.wait_for("the second run's lease given back", lambda: not lease.exists(), 60)
        # Every pass over the first run (it went on being resynced all along) left its one release pod alone.
        release_pods = sum(e.count or 1 for e in runs.events(f"{halted}-release") if e.reason == "SuccessfulCreate")
        assert release_pods == 1, release_pods


def test_a_run_refused_while_the_holder_is_past_its_preflight_only_is_told_so(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    """The field case: the holder's server was still loading (its lease from its preflight), and the refusal spoke
    of "its workers" renewing it. Now it says the preflight took it and what comes next."""
    first, second = new_name("loading"), new_name("second")
    output = f"out/{first}"
    # A server URL nothing answers: the first run's server pod runs and reads as loading for as long as the test.
    operator(["http://127.0.0.1:9"])
    runs.create(cluster_run(first, data_dir, standin_tokenizer, **{"output.path": output}))
    runs.wait(first, "ServerReady", "False", "Loading", timeout=120)

    runs.create(cluster_run(second, data_dir, standin_tokenizer, **{"output.path": output}))
    refused = runs.wait(second, "InputsVerified", "False", "OutputInUse", timeout=90)
    message = refused["message"]
    assert f"is held by {runs.namespace}/{first}" in message, message
    assert "taken by its preflight, and held through its server's start and its canary" in message, message
    assert "its workers are generating" not in message and "renew it every 30 s while they run" not in message
