"""Work stealing between shards against the simulator (worker/stealing.py, output/steal.py): a worker whose own
shard is done takes the chunks another shard has not reached, every (id, sample, turn) is stored exactly once
whoever made it, a kill of the thief or of the victim at any point resumes without loss or repeat, the run's
progress sums to the dataset's, and `datagen verify` passes."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records
from datagen_operator.output.steal import CHUNK_LINES, Claims, chunks_for
from datagen_operator.prompts.shards import shard_of_id
from datagen_operator.steps.verify import verify_output
from tests.harness.processes import wait_until
from tests.harness.sim import start_sim
from tests.worker.simrun import (
    SIM_FLAGS,
    check_records,
    progress,
    prompts,
    reference_renderer,
    run_inprocess,
    spawn,
    spec,
    standin,
    write_dataset,
)
from tests.worker.test_multiturn import check_conversations, conversations

SHARDS = 2
PACED = ("--sim-speed", "gpu", "--sim-ttft-s", "0.01", "--sim-batch-capacity", "256", "--sim-tokens-per-s", "300")


def _run_spec(items: list[dict[str, Any]], tmp_path: Path, **changes: Any) -> dict[str, Any]:
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    return spec(dataset, tmp_path / "out", **{"clients.shards": SHARDS, **changes})


def _shard(document: dict[str, Any], index: int, server: str, *extra: str) -> int:
    return run_inprocess(document, [server], "--shard-index", str(index), "--shard-count", str(SHARDS), *extra)


def _own(items: list[dict[str, Any]], shard: int) -> list[dict[str, Any]]:
    return [item for item in items if shard_of_id(item["id"], SHARDS) == shard]


def _verify(document: dict[str, Any], output: Path, dataset: Path) -> None:
    from datagen_operator.api import parse_run

    run = {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "t"}, "spec": document}
    report = verify_output(output, parse_run(run).spec, tokenizer=reference_renderer().tokenizer, dataset=dataset)
    assert report.passed, {check.name: check.verdict for check in report.checks if not check.passed}


def _progress_sums(output: Path) -> tuple[int, int, int]:
    states = [progress(output, shard) for shard in range(SHARDS)]
    return (
        sum(s["prompts_total"] for s in states),
        sum(s["records_total"] for s in states),
        sum(s["records_done"] for s in states),
    )


def _by_shard(output: Path) -> Counter[int]:
    """Records in each shard's files (Parquet after compaction), by the shard that stored them."""
    from datagen_operator.output.readers import iter_shard_records

    return Counter({shard: sum(1 for _ in iter_shard_records(output, shard)) for shard in range(SHARDS)})


def test_a_worker_done_with_its_shard_takes_the_other_shards_chunks(tmp_path: Path) -> None:
    """Shard 1 runs alone first: after its own prompts it takes every chunk of shard 0, from the last; shard 0's
    worker then finds nothing left to do. Each key once, in shard 1's files; the progress sums to the dataset."""
    items = prompts(400)
    document = _run_spec(items, tmp_path)
    output = tmp_path / "out"
    own0 = _own(items, 0)
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        assert _shard(document, 1, server.url) == EXIT_OK
        claims = Claims(output)
        assert claims.claimed(0) == set(range(chunks_for(len(own0))))
        assert all(claims.owner(0, chunk) == 1 for chunk in claims.claimed(0))
        assert progress(output, 1)["state"] == "complete"
        assert (progress(output, 1)["prompts_total"], progress(output, 1)["records_done"]) == (400, 400)
        assert _shard(document, 0, server.url) == EXIT_OK
    check_records(output, items)
    state0 = progress(output, 0)
    assert (state0["state"], state0["prompts_total"], state0["records_done"]) == ("complete", 0, 0)
    assert _progress_sums(output) == (400, 400, 400)
    assert _by_shard(output) == {0: 0, 1: 400}
    # Compaction kept shard 1's rows in dataset order, shard 0's among its own, none as an orphan.
    assert [record["id"] for record in iter_records(output)] == [item["id"] for item in items]
    _verify(document, output, tmp_path / "prompts.jsonl")


def test_no_steal_leaves_other_shards_alone(tmp_path: Path) -> None:
    items = prompts(200)
    document = _run_spec(items, tmp_path)
    output = tmp_path / "out"
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        assert _shard(document, 1, server.url, "--no-steal") == EXIT_OK
        assert Claims(output).claimed(0) == set()
        assert _shard(document, 0, server.url) == EXIT_OK
    check_records(output, items)
    assert _by_shard(output) == {0: len(_own(items, 0)), 1: len(_own(items, 1))}
    assert _progress_sums(output) == (200, 200, 200)


def test_a_chunk_claimed_but_never_sent_is_finished_by_its_claimant(tmp_path: Path) -> None:
    """A thief killed between its claim and its first request: the victim skips the chunk, the thief's next run
    generates it (even with --no-steal: finishing what it claimed is not stealing more)."""
    items = prompts(300)
    document = _run_spec(items, tmp_path)
    output = tmp_path / "out"
    assert Claims(output).claim(0, 1, 1) == 1
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        assert _shard(document, 0, server.url, "--no-steal") == EXIT_OK
        own0 = _own(items, 0)
        chunk1 = {item["id"] for item in own0[CHUNK_LINES : 2 * CHUNK_LINES]}
        assert chunk1 and not chunk1 & {record["id"] for record in iter_records(output)}
        assert _shard(document, 1, server.url, "--no-steal") == EXIT_OK
    check_records(output, items)
    assert _by_shard(output) == {0: len(own0) - len(chunk1), 1: len(_own(items, 1)) + len(chunk1)}
    assert _progress_sums(output) == (300, 300, 300)
    _verify(document, output, tmp_path / "prompts.jsonl")


def _wait(condition: Any, worker: Any, log: Path, what: str, timeout_s: float = 90.0) -> None:
    wait_until(
        condition, timeout=timeout_s, describe=what, watched=[worker], interval=0.01,
        details=lambda: log.read_text()[-3000:],
    )  # fmt: skip


def _segment_ids(output: Path, shard: int) -> set[str]:
    ids = set()
    for segment in OutputLayout(output).segments(shard):
        for line in segment.read_bytes().splitlines():
            if line.endswith(b"}"):
                ids.add(orjson.loads(line)["id"])
    return ids


def test_the_thief_killed_mid_chunk_resumes_it_and_the_victim_skips_it(tmp_path: Path) -> None:
    items = prompts(400)
    document = _run_spec(items, tmp_path, **{"clients.concurrency": 16})
    output, log = tmp_path / "out", tmp_path / "thief.log"
    own0 = {item["id"] for item in _own(items, 0)}
    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        thief = spawn(document, [server.url], "--shard-index", "1", "--shard-count", "2", "--no-compact", log=log)
        try:
            _wait(lambda: len(_segment_ids(output, 1) & own0) >= 5, thief, log, "a record of a stolen chunk")
            thief.send_signal(signal.SIGKILL)
            thief.wait(timeout=30)
        finally:
            if thief.poll() is None:
                thief.kill()
        stolen = {chunk for chunk in Claims(output).claimed(0) if Claims(output).owner(0, chunk) == 1}
        assert stolen  # it held a claim of shard 0 when it was killed
        assert _shard(document, 1, server.url) == EXIT_OK
        assert _shard(document, 0, server.url) == EXIT_OK
    check_records(output, items)
    assert _progress_sums(output) == (400, 400, 400)
    _verify(document, output, tmp_path / "prompts.jsonl")


def test_the_victim_killed_mid_run_finishes_its_claimed_chunks_and_skips_the_stolen(tmp_path: Path) -> None:
    items = prompts(400)
    document = _run_spec(items, tmp_path, **{"clients.concurrency": 8})
    output, log = tmp_path / "out", tmp_path / "victim.log"
    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        victim = spawn(document, [server.url], "--shard-index", "0", "--shard-count", "2", "--no-compact", log=log)
        try:
            _wait(lambda: len(_segment_ids(output, 0)) >= 5, victim, log, "the victim's first records")
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
        finally:
            if victim.poll() is None:
                victim.kill()
        claims = Claims(output)
        kept = claims.claimed(0)
        assert kept and all(claims.owner(0, chunk) == 0 for chunk in kept)
        assert _shard(document, 1, server.url) == EXIT_OK  # takes the chunks of shard 0 not claimed yet
        taken = {chunk for chunk in claims.claimed(0) if claims.owner(0, chunk) == 1}
        assert taken and not taken & kept
        assert _shard(document, 0, server.url) == EXIT_OK
    check_records(output, items)
    assert _progress_sums(output) == (400, 400, 400)
    _verify(document, output, tmp_path / "prompts.jsonl")


def test_two_workers_at_once_store_each_key_once(tmp_path: Path) -> None:
    """Both shards running together, shard 0's answers slower (its requests go to a paced server): shard 1 takes
    some of its chunks while it still works; nothing is made twice."""
    items = prompts(600)
    document = _run_spec(items, tmp_path, **{"clients.concurrency": 8})
    output = tmp_path / "out"
    with (
        start_sim(*SIM_FLAGS, *PACED, "--sim-tokens-per-s", "120", tokenizer_dir=standin()) as slow,
        start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as fast,
    ):
        workers = [
            spawn(document, [url], "--shard-index", str(i), "--shard-count", "2", log=tmp_path / f"w{i}.log")
            for i, url in enumerate([slow.url, fast.url])
        ]
        for i, worker in enumerate(workers):
            assert worker.wait(timeout=240) == EXIT_OK, (tmp_path / f"w{i}.log").read_text()[-3000:]
    check_records(output, items)
    claims = Claims(output)
    assert {chunk for chunk in claims.claimed(0) if claims.owner(0, chunk) == 1}  # shard 1 took some
    assert _progress_sums(output) == (600, 600, 600)
    _verify(document, output, tmp_path / "prompts.jsonl")


def test_stolen_conversations_are_whole_and_in_order(tmp_path: Path) -> None:
    items = conversations(300)
    document = _run_spec(items, tmp_path, **{"generation.turns": "all"})
    output = tmp_path / "out"
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        assert _shard(document, 1, server.url) == EXIT_OK
        assert Claims(output).held(1, SHARDS)  # it took shard 0's chunks
        assert _shard(document, 0, server.url) == EXIT_OK
    made = check_conversations(output, items)
    states = [progress(output, shard) for shard in range(SHARDS)]
    assert sum(s["records_total"] for s in states) == sum(s["records_done"] for s in states) == made
    assert sum(s["prompts_total"] for s in states) == 300
    _verify(document, output, tmp_path / "prompts.jsonl")


def test_verify_counts_a_key_stored_by_two_shards_as_a_duplicate(tmp_path: Path) -> None:
    """A chunk made by two workers (what the claims rule out) shows in `datagen verify`: the copy in the other
    shard's files is a duplicate row, not silently one record."""
    items = prompts(200)
    document = _run_spec(items, tmp_path)
    output = tmp_path / "out"
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        for shard in (1, 0):
            assert _shard(document, shard, server.url) == EXIT_OK
    _verify(document, output, tmp_path / "prompts.jsonl")
    from datagen_operator.output.readers import iter_shard_records

    copied = next(iter(iter_shard_records(output, 1)))
    (OutputLayout(output).shard_dir(0) / "segment-000099.jsonl").write_bytes(orjson.dumps(copied) + b"\n")
    with pytest.raises(AssertionError, match="1 duplicate rows"):
        _verify(document, output, tmp_path / "prompts.jsonl")


def test_an_output_begun_without_claims_keeps_other_workers_off_its_shards(tmp_path: Path) -> None:
    """Records made before claims existed (an output begun by an older worker): no claim says what they cover,
    so no other worker may take that shard's chunks, before its worker comes back (its files hold records) or
    after (it closes its shard); everything is still made exactly once."""
    import shutil

    items = prompts(300)
    document = _run_spec(items, tmp_path, **{"clients.concurrency": 8})
    output, log = tmp_path / "out", tmp_path / "old.log"
    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        old = spawn(document, [server.url], "--shard-index", "0", "--shard-count", "2", "--no-compact", log=log)
        try:
            _wait(lambda: len(_segment_ids(output, 0)) >= 5, old, log, "the first records")
            old.send_signal(signal.SIGKILL)
            old.wait(timeout=30)
        finally:
            if old.poll() is None:
                old.kill()
        shutil.rmtree(output / "claims")  # what an older worker left: records, no claims
        assert _shard(document, 1, server.url) == EXIT_OK
        assert Claims(output).claimed(0) == set()  # shard 1 took nothing of shard 0
        assert _shard(document, 0, server.url, "--no-compact") == EXIT_OK
        assert Claims(output).closed(0)
    check_records(output, items)
    assert _by_shard(output) == {0: len(_own(items, 0)), 1: len(_own(items, 1))}
    assert _progress_sums(output) == (300, 300, 300)
