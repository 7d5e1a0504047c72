"""Whether a dataset is usable, counted before anything is launched: its valid prompts and its lines set aside
by cause; refused with no valid prompt, or when mostly of a shape this reader does not know (another kind of
dataset)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from datagen_operator.api.words import agrees, plural
from datagen_operator.prompts.dataset_ref import DatasetError, DatasetRef, unit_of
from datagen_operator.prompts.line_shape import UNKNOWN_SHAPE
from datagen_operator.prompts.lines import MalformedLine
from datagen_operator.prompts.plan import ShardPlan
from datagen_operator.prompts.scan import ShardScan


class EmptyDataset(DatasetError):
    """The dataset has no valid prompt: a run over it would launch a server to generate nothing."""


class UnknownDatasetShape(DatasetError):
    """Most of the dataset's lines are of a shape this reader does not know: another kind of dataset."""


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """What a dataset holds, counted before anything is launched."""

    path: str
    format: str
    lines: int
    prompts: int
    """Valid prompts with a unique id: what the run will generate for."""
    set_aside: dict[str, int]
    """cause -> lines set aside (CAUSES)."""
    examples: dict[str, str]
    """cause -> the first such line's number and reason."""

    @property
    def non_blank(self) -> int:
        """Lines that hold something: the valid prompts and every line set aside (duplicates included)."""
        return self.prompts + sum(self.set_aside.values())


def dataset_summary(dataset: DatasetRef) -> DatasetSummary:
    """Count the valid prompts and the lines set aside, by cause (reads the whole dataset once, streamed:
    only the counts are kept; every line, whatever the dataset's sample)."""
    scan = ShardScan(replace(dataset, sample=None), 0, 1)
    unit = unit_of(scan.format)
    prompts = 0
    set_aside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for item in scan:
        if not isinstance(item, MalformedLine):
            prompts += 1
            continue
        set_aside[item.cause] = set_aside.get(item.cause, 0) + 1
        examples.setdefault(item.cause, f"{unit} {item.position + 1}: {item.reason}")
    return DatasetSummary(str(scan.path), scan.format, scan.lines_total, prompts, set_aside, examples)


def check_dataset(dataset: DatasetRef) -> DatasetSummary:
    """The summary of a usable dataset; EmptyDataset (naming spec.dataset.path) when it has no valid prompt,
    UnknownDatasetShape when more than half its non-blank lines are of an unknown shape (a dataset of another
    kind, whose few lines that happen to parse as chats would be a run over the wrong data), DatasetError when
    it cannot be read. For the runners to call before a server is launched."""
    return _usable(dataset_summary(dataset))


def check_plan(plan: ShardPlan) -> DatasetSummary:
    """check_dataset over a plan of the whole dataset (shard 0 of 1) already read: no second pass."""
    if plan.shard_count != 1:
        raise ValueError("check_plan needs the plan of the whole dataset (shard 0 of 1)")
    return _lines_usable(plan.path, plan.format, plan.lines_total, len(plan.prompts), plan.malformed)


def check_lines(scan: ShardScan, prompts: int, malformed: list[MalformedLine]) -> DatasetSummary:
    """check_dataset over a scan of the whole dataset (shard 0 of 1) already iterated: its valid prompts counted,
    its lines set aside kept."""
    if scan.shard_count != 1:
        raise ValueError("check_lines needs a scan of the whole dataset (shard 0 of 1)")
    if scan.subset is not None and prompts == 0 and not malformed:
        raise EmptyDataset(
            f"spec.dataset.path {scan.path}: spec.dataset.sample keeps no line of its {scan.lines_total} "
            f"({scan.subset.said()}): raise spec.dataset.sample.fraction, or set a count"
        )
    return _lines_usable(scan.path, scan.format, scan.lines_total, prompts, malformed)


def _lines_usable(path: Path, form: str, lines: int, prompts: int, malformed: list[MalformedLine]) -> DatasetSummary:
    unit = unit_of(form)
    set_aside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for line in malformed:
        set_aside[line.cause] = set_aside.get(line.cause, 0) + 1
        examples.setdefault(line.cause, f"{unit} {line.position + 1}: {line.reason}")
    return _usable(DatasetSummary(str(path), form, lines, prompts, set_aside, examples))


def _usable(summary: DatasetSummary) -> DatasetSummary:
    if summary.prompts == 0:
        raise EmptyDataset(empty_dataset_message(summary))
    unknown = summary.set_aside.get(UNKNOWN_SHAPE, 0)
    if 2 * unknown > summary.non_blank:
        raise UnknownDatasetShape(
            f"spec.dataset.path {summary.path}: {unknown} of {plural(summary.non_blank, unit_of(summary.format))} "
            f"{agrees(unknown, 'is', 'are')} of "
            f"an unknown shape (e.g. {summary.examples[UNKNOWN_SHAPE]}); this is not a chat dataset this reader "
            "knows: convert it, or point spec.dataset.path at the right file"
        )
    return summary


def empty_dataset_message(summary: DatasetSummary) -> str:
    lines = plural(summary.lines, unit_of(summary.format))
    if not summary.set_aside:
        return f"spec.dataset.path {summary.path}: the dataset is empty ({lines}, no prompt)"
    causes = "; ".join(
        f"{count} {cause} (e.g. {summary.examples[cause]})" for cause, count in sorted(summary.set_aside.items())
    )
    return f"spec.dataset.path {summary.path}: no valid prompt in {lines}; set aside: {causes}"
