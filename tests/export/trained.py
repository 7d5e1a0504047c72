"""What a trainer's loader will train on, against what the model generated: stdlib only, so the consumers' venv
(tests/export/consumers.py) and `make test` run the same comparison.

A generated token is *in place* in a loader's row when the row starts with its record's `input_ids + output_ids`
(the exact context it was generated on, then the answer up to it). The rows are matched to records by content, not
by id: a loader may shuffle rows and drop every column but `input_ids` and `loss_mask`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trained:
    """Counts over every row a loader built, against every record of the run."""

    rows: int = 0
    generated: int = 0  # output tokens of every record
    supervised: int = 0  # positions with mask 1 in the loader's rows
    supervised_in_place: int = 0  # of those, a generated token in its generated place
    generated_once: int = 0  # generated tokens supervised in place in exactly one row
    generated_more: int = 0  # ... in more than one row (counted twice by the drafter)
    records_whole: int = 0  # records whose every output token is supervised in place exactly once
    records: int = 0
    examples: list[str] = field(default_factory=list)  # a few records not trained on whole

    @property
    def ratio(self) -> float:
        """Generated tokens trained exactly once in place / generated tokens: 1.00 is the goal."""
        return self.generated_once / self.generated if self.generated else 0.0

    @property
    def not_generated(self) -> int:
        """Supervised positions that are not a generated token in its place (text the model never wrote there)."""
        return self.supervised - self.supervised_in_place

    def summary(self) -> str:
        return (
            f"{self.rows} rows; supervised {self.supervised} tokens, {self.supervised_in_place} of them generated in "
            f"place, {self.not_generated} not; generated {self.generated}: {self.generated_once} trained exactly once "
            f"({self.ratio:.2f}), {self.generated_more} more than once; {self.records_whole}/{self.records} answers whole"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "generated": self.generated, "supervised": self.supervised,
            "supervised_in_place": self.supervised_in_place, "not_generated": self.not_generated,
            "generated_once": self.generated_once, "generated_more": self.generated_more, "ratio": round(self.ratio, 4),
            "records_whole": self.records_whole, "records": self.records, "examples": self.examples,
        }  # fmt: skip


def compare(rows: Iterable[tuple[Sequence[int], Sequence[int]]], records: Sequence[dict[str, Any]]) -> Trained:
    """`rows`: (input_ids, loss_mask) as the loader built them; `records`: the run's records (`id`, `sample`,
    `turn`, `input_ids`, `output_ids`)."""
    by_first: dict[int, list[int]] = {}
    for index, record in enumerate(records):
        by_first.setdefault(record["input_ids"][0], []).append(index)
    hits = [[0] * len(record["output_ids"]) for record in records]  # per record, per output token: rows
    out = Trained(records=len(records), generated=sum(len(r["output_ids"]) for r in records))
    for ids, mask in rows:
        ids, mask = [int(t) for t in ids], [int(m) for m in mask]
        assert len(ids) == len(mask), "input_ids and loss_mask differ in length"
        out.rows += 1
        supervised = {i for i, m in enumerate(mask) if m}
        out.supervised += len(supervised)
        in_place: set[int] = set()
        for index in by_first.get(ids[0], []) if ids else []:
            prompt, completion = records[index]["input_ids"], records[index]["output_ids"]
            end = len(prompt) + len(completion)
            if end <= len(ids) and ids[: len(prompt)] == prompt and ids[len(prompt) : end] == completion:
                for offset in range(len(completion)):
                    if len(prompt) + offset in supervised:
                        hits[index][offset] += 1
                        in_place.add(len(prompt) + offset)
        out.supervised_in_place += len(in_place)
    for index, record in enumerate(records):
        counts = hits[index]
        out.generated_once += sum(1 for n in counts if n == 1)
        out.generated_more += sum(1 for n in counts if n > 1)
        if all(n == 1 for n in counts):
            out.records_whole += 1
        elif len(out.examples) < 5:
            untrained = sum(1 for n in counts if n == 0)
            name = f"{record['id']}#{record['sample']}@{record.get('turn', 0)}"
            out.examples.append(f"{name}: {untrained}/{len(counts)} generated tokens not trained in place")
    return out
