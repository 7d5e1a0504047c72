"""A shard's plan: the whole dataset read once, what one shard owns kept (its prompts' places, its lines set
aside), each prompt loaded back when it is sent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.prompts.dataset_ref import DatasetRef, ReadFormat
from datagen_operator.prompts.lines import MalformedLine, Prompt, PromptRef, prompt_from
from datagen_operator.prompts.scan import ShardScan

if TYPE_CHECKING:
    from datagen_operator.prompts.draws import VariableDraws


@dataclass
class ShardPlan:
    """This shard's prompts in dataset order, plus the malformed lines it owns."""

    path: Path
    format: ReadFormat
    shard_index: int
    shard_count: int
    prompts: list[PromptRef]
    malformed: list[MalformedLine]
    lines_total: int
    _rows: dict[int, dict[str, Any]]
    valid_lines_total: int = 0
    """Valid prompt lines in the whole dataset (every shard's, duplicates included): 0 means empty."""
    draws: VariableDraws | None = None
    """generation.templateVariableMix (prompt_from)."""

    def load(self, ref: PromptRef, handle: Any = None) -> Prompt:
        """The full prompt; `handle` is an open binary file of a JSONL or JSON dataset (saves reopening)."""
        if self.format == "parquet":
            obj = self._rows[ref.position]
        elif handle is not None:
            handle.seek(ref.offset)
            obj = orjson.loads(handle.read(ref.length).strip())  # stripped as the scan parsed it
        else:
            with self.path.open("rb") as file:
                file.seek(ref.offset)
                obj = orjson.loads(file.read(ref.length).strip())
        return prompt_from(ref, obj, self.draws)

    def iter_prompts(self) -> Iterator[Prompt]:
        with self.path.open("rb") as handle:
            for ref in self.prompts:
                yield self.load(ref, handle)


def plan_shard(
    dataset: DatasetRef, shard_index: int, shard_count: int, *, draws: VariableDraws | None = None
) -> ShardPlan:
    """Read the whole dataset once and keep what shard `shard_index` of `shard_count` owns (of the subset, with a
    sample)."""
    scan = ShardScan(dataset, shard_index, shard_count)
    prompts: list[PromptRef] = []
    malformed: list[MalformedLine] = []
    rows: dict[int, dict[str, Any]] = {}
    for item in scan:
        if isinstance(item, MalformedLine):
            malformed.append(item)
            continue
        ref, obj = item
        prompts.append(ref)
        if scan.format == "parquet":
            rows[ref.position] = obj
    return ShardPlan(
        scan.path, scan.format, shard_index, shard_count, prompts, malformed, scan.lines_total, rows,
        valid_lines_total=scan.valid_lines_total, draws=draws,
    )  # fmt: skip
