"""prompts/seen.SeenHashes: exact duplicate detection in a fraction of a set's memory."""

from __future__ import annotations

import random

from datagen_operator.prompts.seen import SeenHashes


def test_every_repeat_is_found_and_nothing_else_across_merges_and_bitmap_collisions() -> None:
    rng = random.Random(20261203)
    # A bitmap capped tiny (every bit soon set: every new hash is searched) and frequent merges: each path.
    seen, truth = SeenHashes(merge_every=7, max_bits=64), set()
    values = [rng.getrandbits(64) - (1 << 63) for _ in range(3000)]
    stream = values + rng.sample(values, 500) + [v ^ 1 for v in values[:200]]  # repeats, and near misses
    rng.shuffle(stream)
    for value in stream:
        assert seen.add(value) == (value not in truth), value
        truth.add(value)
    assert len(seen) == len(truth)


def test_the_extremes_of_a_signed_64_bit_hash() -> None:
    seen = SeenHashes(merge_every=2, max_bits=8)
    for value in (-(1 << 63), (1 << 63) - 1, 0, -1):
        assert seen.add(value) and not seen.add(value)
    assert not seen.add(-(1 << 63)), "after a merge too"


def test_the_bitmap_grows_with_the_count_and_keeps_every_hash() -> None:
    rng = random.Random(7)
    seen = SeenHashes(merge_every=1000)
    values = [rng.getrandbits(64) - (1 << 63) for _ in range(20_000)]  # the bitmap doubles 5 times
    assert all(seen.add(v) for v in values)
    assert not any(seen.add(v) for v in values), "every hash is still found after the bitmap was rebuilt"
    assert len(seen) == 20_000
