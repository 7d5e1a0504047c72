"""The 64-bit id hashes a dataset read has seen, in about 20 bytes each instead of about 76.

A Python set of a million int hashes holds ~76 MB (an int object and a 16-byte slot, at most two-thirds full): in
the preflight of 1M prompts it was the largest part of the main process after the tokenizer. Here a hash is
kept in a sorted numpy array (8 bytes), the newest in a small set that is merged into it every MERGE_EVERY, and
a bitmap over the hashes' low bits answers "certainly new" for almost every new id without a search. The bitmap
grows with the count (BITS_PER_HASH), so a worker that has read a few thousand lines holds a few KB of it. Exact:
a hash is only reported seen after it is found in the set or the array; the bitmap only saves searches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

BITS_PER_HASH = 64
"""Bitmap bits per hash held: one bit in 64 at most is set, so over 98 % of new ids skip the search."""
MIN_BITS = 1 << 16
MAX_BITS = 1 << 27
"""16 MiB, reached at 2M ids; beyond that the share of searches grows (10M ids: 7 %)."""
MERGE_EVERY = 1 << 16
"""Hashes held in the set before they are merged into the sorted array (~5 MB at most)."""


class SeenHashes:
    def __init__(self, merge_every: int = MERGE_EVERY, max_bits: int = MAX_BITS) -> None:
        self._merge_every, self._max_bits = merge_every, max_bits
        self._recent: set[int] = set()
        self._sorted: np.ndarray[Any, np.dtype[np.int64]] = np.empty(0, dtype=np.int64)
        self._count = 0
        self._bitmap(min(MIN_BITS, max_bits))

    def __len__(self) -> int:
        return self._count

    def __contains__(self, value: int) -> bool:
        bit = value & self._mask
        return bool(self._bits[bit >> 3] & (1 << (bit & 7))) and self._seen(value)

    def add(self, value: int) -> bool:
        """Add a hash (a signed 64-bit int: Python's `hash`); True when it was not seen before."""
        bit = value & self._mask
        byte, flag = bit >> 3, 1 << (bit & 7)
        bits = self._bits
        if bits[byte] & flag and self._seen(value):
            return False
        bits[byte] |= flag
        recent = self._recent
        recent.add(value)
        self._count += 1
        if len(recent) >= self._merge_every:
            self._merge()
        if self._count > self._grow_at:
            self._bitmap(self._nbits * 2)
        return True

    def _seen(self, value: int) -> bool:
        if value in self._recent:
            return True
        at = int(self._sorted.searchsorted(value))
        return at < len(self._sorted) and int(self._sorted[at]) == value

    def _merge(self) -> None:
        fresh = np.fromiter(self._recent, dtype=np.int64, count=len(self._recent))
        merged = np.concatenate((self._sorted, fresh))
        merged.sort(kind="stable")  # two sorted runs (timsort): linear
        self._sorted = merged
        self._recent = set()

    def _bitmap(self, nbits: int) -> None:
        """A bitmap of `nbits` (a power of two) over every hash held."""
        self._nbits, self._mask = nbits, nbits - 1
        self._grow_at = nbits // BITS_PER_HASH if nbits < self._max_bits else 1 << 62
        held = np.concatenate((self._sorted, np.fromiter(self._recent, dtype=np.int64, count=len(self._recent))))
        index = held & self._mask
        bitmap = np.zeros(nbits // 8, dtype=np.uint8)
        np.bitwise_or.at(bitmap, index >> 3, (1 << (index & 7)).astype(np.uint8))
        self._bits = bytearray(bitmap.tobytes())
