"""output/lease.py: one owner per output, taken atomically, renewed by its holder, taken over once stale."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.output import lease as lease_module
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.lease import (
    Holder,
    OutputInUse,
    live_lease,
    read_lease,
    release_lease,
    take_lease,
)
from datagen_operator.output.lease import main as lease_main
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.local.runs import PROMPTS
from tests.manifests import local_run, write_run
from tests.programs import one_shard_worker, run_program

A = Holder("uid-a", "team-a/kimi-b1")
B = Holder("uid-b", "team-b/kimi-b1")


def test_one_holder_at_a_time_renewed_by_its_holder(tmp_path: Path) -> None:
    first = take_lease(tmp_path, A, 60, now=1000.0)
    assert (first.holder, first.expires_at) == ("uid-a", 1060.0)
    with pytest.raises(OutputInUse) as refused:
        take_lease(tmp_path, B, 60, now=1010.0)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path} is held by team-a/kimi-b1 (lease holder uid-a) until 1970-01-01T00:17:40Z")
    assert "50 s from now (renewed 10 s ago" in message and "set another spec.output.path" in message
    assert "takes the output over" not in message.replace("does not take the output over", "")
    assert take_lease(tmp_path, A, 60, now=1050.0).expires_at == 1110.0  # renewed
    assert live_lease(tmp_path, "uid-b", now=1100.0) is not None and live_lease(tmp_path, "uid-a", now=1100.0) is None


def test_an_expired_lease_is_taken_over(tmp_path: Path) -> None:
    take_lease(tmp_path, A, 60, now=1000.0)
    taken = take_lease(tmp_path, B, 60, now=1061.0)
    assert read_lease(tmp_path) == taken and taken.holder == "uid-b"
    with pytest.raises(OutputInUse):  # the old holder lost it: it may not renew over the new one
        take_lease(tmp_path, A, 60, now=1062.0)
    assert [p.name for p in tmp_path.iterdir()] == [OutputLayout(tmp_path).lease.name], (
        "no staging file or lock left behind"
    )


def test_a_local_holder_that_is_gone_is_stale_at_once(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = Holder.parse(f"local:{os.uname().nodename}:{gone.stdout.strip()}", "quickstart")
    take_lease(tmp_path, dead, 3600)
    mine = Holder.this_process("quickstart")
    assert mine.run == f"datagen run quickstart (pid {os.getpid()} on {os.uname().nodename})"
    assert take_lease(tmp_path, mine, 3600).holder == mine.id
    release_lease(tmp_path, dead)  # not its lease any more: left alone
    assert read_lease(tmp_path) is not None
    release_lease(tmp_path, mine)
    assert read_lease(tmp_path) is None


def test_a_release_gives_back_only_its_holders_lease_taken_before_the_halt(tmp_path: Path) -> None:
    take_lease(tmp_path, A, 4500, now=1000.0)
    assert release_lease(tmp_path, B, taken_before=2000.0) is None and read_lease(tmp_path) is not None
    # A later attempt of the same run (the spec fixed after the halt) renewed it: not the halted attempt's lease.
    assert release_lease(tmp_path, A, taken_before=999.0) is None and read_lease(tmp_path) is not None
    released = release_lease(tmp_path, A, taken_before=1000.0)
    assert released is not None and released.holder == "uid-a" and read_lease(tmp_path) is None


def test_the_release_program_says_what_it_found_and_always_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    take_lease(tmp_path, A, 4500, now=1000.0)
    assert lease_main([str(tmp_path), "--lease-holder", "uid-b"]) == 0
    assert "held by team-a/kimi-b1, not by uid-b: left alone" in capsys.readouterr().out
    assert lease_main([str(tmp_path), "--lease-holder", "uid-a", "--taken-before", "999"]) == 0
    assert "taken again after the halt" in capsys.readouterr().out and read_lease(tmp_path) is not None
    assert lease_main([str(tmp_path), "--lease-holder", "uid-a", "--taken-before", "1000"]) == 0
    assert "gave back" in capsys.readouterr().out and read_lease(tmp_path) is None
    assert lease_main([str(tmp_path), "--lease-holder", "uid-a"]) == 0
    assert "no lease to give back" in capsys.readouterr().out
    assert lease_main([str(tmp_path / "never-mounted"), "--lease-holder", "uid-a"]) == 0


def test_the_release_program_on_a_volume_that_refuses_writes_says_when_the_lease_lapses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    take_lease(tmp_path, A, 4500, now=1000.0)

    def read_only(*_: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(lease_module, "release_lease", read_only)
    assert lease_main([str(tmp_path), "--lease-holder", "uid-a"]) == 0, "no pod left in Error for it"
    said = capsys.readouterr().out
    assert "could not give" in said and "Read-only file system" in said and "lapses at 1970-01-01T01:31:40Z" in said


def test_of_many_racing_takers_of_a_stale_lease_exactly_one_holds_it(tmp_path: Path) -> None:
    take_lease(tmp_path, A, 1, now=0.0)  # long expired
    won: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(8)

    def taker(index: int) -> None:
        start.wait()
        try:
            won.append(take_lease(tmp_path, Holder(f"uid-{index}", f"run-{index}"), 60).holder)
        except OutputInUse as busy:
            refused.append(busy.lease.holder)

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    holder = read_lease(tmp_path)
    assert holder is not None and won == [holder.holder], (won, refused)
    assert len(refused) == 7 and set(refused) == {holder.holder}


def test_a_worker_of_another_run_is_refused_naming_the_holder(tmp_path: Path) -> None:
    standin = ensure_standin_tokenizer()
    output = tmp_path / "out"
    take_lease(output, A, 600)
    run_file = write_run(tmp_path / "run.yaml", local_run(standin, PROMPTS, output))
    for holder in ("uid-b", None):  # another run's worker, and one run by hand
        worker = run_program(one_shard_worker(run_file, output, "http://127.0.0.1:9", holder), timeout=120)
        assert worker.returncode == EXIT_BAD_INPUT, worker.stderr
        assert "OutputInUse" in worker.stderr and "team-a/kimi-b1" in worker.stderr
    assert read_lease(output).holder == "uid-a"  # type: ignore[union-attr]
    assert {p.name for p in output.iterdir()} == {OutputLayout(output).lease.name}, "nothing written: no pin, no claim"


def test_the_runs_last_shard_gives_the_lease_back_and_not_before(tmp_path: Path) -> None:
    """A finished run leaves no lease to lapse: another run may take the output at once (issue 34 item 4)."""
    from tests.harness.sim import start_sim
    from tests.worker.simrun import SIM_FLAGS, prompts, spawn, spec, standin, write_dataset

    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(12, tools_every=0))
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.shards": 2, "clients.concurrency": 2})
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        for shard, lease_left in ((0, True), (1, False)):
            extra = ("--shard-index", str(shard), "--lease-holder", "uid-a", "--render-processes", "0", "--no-steal")
            worker = spawn(document, [server.url], *extra, log=tmp_path / f"worker-{shard}.log")
            assert worker.wait(timeout=120) == 0, (tmp_path / f"worker-{shard}.log").read_text()[-3000:]
            assert (read_lease(output) is not None) is lease_left, shard


@pytest.mark.parametrize("on_failure", ["Halt", "Warn"])
def test_a_canary_refusal_that_halts_the_run_gives_the_lease_back(tmp_path: Path, on_failure: str) -> None:
    """Halted before any bulk record, the run writes nothing more: the preflight's lease (its startup budget
    plus 30 minutes) goes at once. A refusal the run only warns of keeps it: the workers come next."""
    from datagen_operator.api.exit_codes import EXIT_FAILED_VERDICT
    from datagen_operator.steps import canary
    from tests.harness.sim import start_sim
    from tests.worker.simrun import SIM_FLAGS, prompts, spec, standin, write_dataset

    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(8, tools_every=0))
    output = tmp_path / "out"
    document = spec(dataset, output, **{"checks.canaryPrompts": 2, "checks.onFailure": on_failure})
    run_file = write_run(tmp_path / "run.yaml", {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun",
                                                 "metadata": {"name": "k"}, "spec": document})  # fmt: skip
    take_lease(output, A, 3600)
    # The server leaks prompt-suffix tokens into its answers: the canary refuses.
    with start_sim(*SIM_FLAGS, "--sim-prompt-suffix-leak", "3", tokenizer_dir=standin()) as server:
        argv = ["--run", str(run_file), "--server", server.url, "--output", str(output), "--lease-holder", "uid-a"]
        assert canary.main(argv) == EXIT_FAILED_VERDICT
    assert (read_lease(output) is None) is (on_failure == "Halt")
