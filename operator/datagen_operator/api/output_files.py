"""Names of the files a run writes in its output directory that a layer outside `output/` names too: the
operator's canary Job is told where to write its records (k8s/ cannot import output/), and the dataset pin is
written by prompts/pin.py (below output/). `OutputLayout` (output/layout.py) builds its paths from these, so each
name is spelled once."""

from __future__ import annotations

from typing import Final

CANARY_RECORDS: Final = "canary.jsonl"
"""The canary's records, beside the run's (never mixed into them)."""
DATASET_PIN: Final = "dataset.pin.json"
"""The dataset's identity when the run first read it: path, format, lines, bytes, sha256."""
DATASET_LINE_HASHES: Final = "dataset.lines.u64"
"""One 64-bit hash a dataset line, little-endian: what changed lines are found by."""
LINE_HASH_BYTES: Final = 8
"""The size of one entry of DATASET_LINE_HASHES."""
