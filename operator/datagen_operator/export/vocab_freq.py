"""How often each token id occurs in the supervised (completion) tokens of the exported rows.

Drafters such as EAGLE-3 build a reduced draft vocabulary from these counts (SpecForge and speculators
count the tokens under the loss mask the same way). Written beside the export as
`token_freq.npy` (int64, index = token id, length = vocabulary size) and `token_freq.json`
(`{"vocab_size", "total", "distinct", "counts": {"<id>": n, ...}}`, ids with a count only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from datagen_operator.output.layout import write_atomic

NPY_NAME = "token_freq.npy"
JSON_NAME = "token_freq.json"


class TokenFrequency:
    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, batch_counts: np.ndarray) -> None:
        """Add one batch's `np.bincount` (any length): the array grows to the largest id seen."""
        if len(batch_counts) > len(self.counts):
            self.counts = np.concatenate([self.counts, np.zeros(len(batch_counts) - len(self.counts), np.int64)])
        self.counts[: len(batch_counts)] += batch_counts

    def dense(self, vocab_size: int | None = None) -> np.ndarray:
        size = max(len(self.counts), vocab_size or 0)
        out = np.zeros(size, dtype=np.int64)
        out[: len(self.counts)] = self.counts
        return out

    def summary(self, vocab_size: int | None = None) -> dict[str, Any]:
        return {
            "vocab_size": max(len(self.counts), vocab_size or 0),
            "total": int(self.counts.sum()),
            "distinct": int(np.count_nonzero(self.counts)),
        }

    def write(self, directory: Path, vocab_size: int | None = None) -> dict[str, Any]:
        dense = self.dense(vocab_size)
        with (directory / NPY_NAME).open("wb") as file:
            np.save(file, dense)
        nonzero = np.flatnonzero(dense)
        document = {
            **self.summary(vocab_size),
            "counts": dict(zip(map(str, nonzero.tolist()), dense[nonzero].tolist(), strict=True)),
        }
        write_atomic(directory / JSON_NAME, orjson.dumps(document))
        return {**self.summary(vocab_size), "files": [NPY_NAME, JSON_NAME]}
