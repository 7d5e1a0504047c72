"""SGLang's radix (prefix) cache, approximated at page granularity for `meta_info.cached_tokens`."""

from __future__ import annotations

import hashlib
from array import array


class PrefixCache:
    """Remembers hashes of page-aligned prompt prefixes; a prompt's cached tokens are its longest
    remembered prefix, in whole pages, and never the last prompt token (SGLang always computes it)."""

    def __init__(self, page_size: int = 64, max_entries: int = 1_000_000) -> None:
        self.page_size = page_size
        self.max_entries = max_entries
        self._seen: set[bytes] = set()

    def match_and_insert(self, prompt: array[int]) -> int:
        data = prompt.tobytes()
        page_bytes = 4 * self.page_size
        digest = hashlib.blake2b(digest_size=16)
        cached = 0
        matching = True
        for end in range(page_bytes, len(data) + 1, page_bytes):
            digest.update(data[end - page_bytes : end])
            key = digest.copy().digest()
            if matching and key in self._seen:
                cached = end // 4
            else:
                matching = False
                self._seen.add(key)
        if len(self._seen) > self.max_entries:  # crude eviction: a cold cache, as after a flush
            self._seen.clear()
        return min(cached, max(0, len(prompt) - 1))

    def flush(self) -> None:
        self._seen.clear()
