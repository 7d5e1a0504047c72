"""The claim protocol of work stealing (output/steal.py): one owner per chunk, whoever races for it, and a claim
never seen half made."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import os
from pathlib import Path

import pytest

from datagen_operator.output.steal import Claims, chunk_of, chunks_for


def test_chunks_cut_a_shards_items_in_order() -> None:
    assert [chunk_of(i, 4) for i in range(9)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    assert (chunks_for(0, 4), chunks_for(8, 4), chunks_for(9, 4)) == (0, 2, 3)


def test_the_first_claim_wins_and_every_later_one_reads_its_owner(tmp_path: Path) -> None:
    claims = Claims(tmp_path)
    assert claims.owner(0, 3) is None
    assert claims.claim(0, 3, 2) == 2
    assert claims.claim(0, 3, 0) == 2  # the shard's own worker comes too late: the chunk is shard 2's
    assert Claims(tmp_path).claim(0, 3, 1) == 2  # another process's view
    assert claims.owner(0, 3) == 2
    assert claims.claim(0, 4, 0) == 0
    assert claims.claimed(0) == {3, 4}
    assert claims.held(2, 3) == {0: [3]} and claims.held(0, 3) == {}
    assert sorted(p.name for p in claims.shard_dir(0).iterdir()) == ["00000003", "00000004"]  # no temporary left


def test_a_claim_interrupted_before_its_link_is_no_claim(tmp_path: Path) -> None:
    """A crash after the temporary file was written but before it was linked: nobody owns the chunk (none of it
    was sent), and the next claimer gets it."""
    claims = Claims(tmp_path)
    claims.shard_dir(1).mkdir(parents=True)
    (claims.shard_dir(1) / ".00000000.0.99999.tmp").write_text("0 other-host:99999:1\n")
    assert claims.owner(1, 0) is None and claims.claimed(1) == set()
    assert claims.claim(1, 0, 2) == 2


def _race(root: str, claimant: int, start: multiprocessing.synchronize.Barrier, chunks: int, out: object) -> None:
    claims = Claims(Path(root))
    start.wait()
    won = [chunk for chunk in range(chunks) if claims.claim(0, chunk, claimant) == claimant]
    out.put((claimant, won))  # type: ignore[attr-defined]


@pytest.mark.parametrize("racers", [2, 6])
def test_racing_claimers_each_chunk_has_exactly_one_owner(tmp_path: Path, racers: int) -> None:
    """Processes claiming the same chunks at once (each from the first up, the worst case): every chunk is won by
    exactly one of them, and the file names the winner."""
    context = multiprocessing.get_context("fork")
    start, out, chunks = context.Barrier(racers), context.Queue(), 200
    procs = [context.Process(target=_race, args=(str(tmp_path), i, start, chunks, out)) for i in range(racers)]
    for proc in procs:
        proc.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    won = [chunk for chunks_won in results.values() for chunk in chunks_won]
    assert sorted(won) == list(range(chunks))  # each chunk once, none lost
    claims = Claims(tmp_path)
    for claimant, chunks_won in results.items():
        assert all(claims.owner(0, chunk) == claimant for chunk in chunks_won)
    assert not [name for name in os.listdir(claims.shard_dir(0)) if not name.isdigit()]


def test_the_first_worker_settles_the_chunk_size_for_every_later_one(tmp_path: Path) -> None:
    assert Claims(tmp_path, chunk_lines=4).settle() == 4
    later = Claims(tmp_path, chunk_lines=16)
    assert later.settle() == 4 and later.chunk_lines == 4
