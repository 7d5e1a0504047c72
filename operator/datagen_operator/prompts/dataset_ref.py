"""Which dataset file a reader reads and as what: the run's dataset as every reader takes it (DatasetRef: path,
format, id field, sample), the format a file is read as (declared, or detected from the file), and the error of a
dataset that cannot be read at all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

import orjson

if TYPE_CHECKING:  # the spec models load pydantic: a reader given a bare path needs none of it
    from datagen_operator.api.generation_spec import DatasetSample, DatasetSpec

DatasetFormat = Literal["auto", "jsonl", "json", "parquet"]
ReadFormat = Literal["jsonl", "json", "parquet"]

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
JSON_WS = b" \t\r\n"
"""JSON's whitespace."""


class DatasetError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


@dataclass(frozen=True, slots=True)
class DatasetRef:
    """A dataset as every reader takes it (the scan, a shard's plan, the summary, the pin): the file on this
    machine and how the run reads it. `of` builds it from spec.dataset, so no reader spells the spec's fields."""

    path: Path
    format: DatasetFormat = "auto"
    """spec.dataset.format: declared, or `auto` (detect_format)."""
    id_field: str | None = None
    """spec.dataset.idField: the field holding each line's id (None: `id`)."""
    sample: DatasetSample | None = None
    """spec.dataset.sample: the subset a run generates for (None: every line)."""

    @classmethod
    def of(cls, dataset: DatasetSpec | None, path: Path | str | None = None) -> DatasetRef:
        """spec.dataset, read at `path` (where the file is on this machine: the pod's mount, a local path, a
        --dataset override), else at spec.dataset.path. Without a spec (`datagen verify OUTPUT` of an output
        with no run.yaml), the file at `path` as a bare dataset: format detected, ids in `id`, every line."""
        if dataset is None:
            if path is None:
                raise ValueError("a dataset without a spec needs its path")
            return cls(Path(path))
        return cls(Path(dataset.path if path is None else path), dataset.format, dataset.id_field, dataset.sample)

    def read_format(self) -> ReadFormat:
        """The format the file is read as: the declared one, else detected from the file (reads its head)."""
        return detect_format(self.path, self.format)


def unit_of(form: str) -> str:
    """What a position counts in a dataset of this format, for a person: a JSON array's elements are not lines."""
    return "element" if form == "json" else "line"


def detect_format(path: Path, declared: DatasetFormat) -> ReadFormat:
    if declared != "auto":
        return declared
    if path.suffix.lower() in (".parquet", ".pq"):
        return "parquet"
    with path.open("rb") as file:
        head = file.read(4)
        if head == b"PAR1":
            return "parquet"
        file.seek(len(UTF8_BOM) if head.startswith(UTF8_BOM) else 0)
        return "json" if _starts_json_array(file) else "jsonl"


_FIRST_LINE_LIMIT = 1 << 20


def _starts_json_array(file: IO[bytes]) -> bool:
    """Whether the text from here is one JSON array rather than JSONL: its first non-whitespace byte is `[`,
    unless the first line is a whole JSON value with more lines after it (JSONL whose first line is an array,
    which an older reader took as JSONL: a line set aside, not the whole file misread)."""
    while True:
        block = file.read(1 << 16)
        if not block:
            return False
        start = len(block) - len(block.lstrip(JSON_WS))
        if start < len(block):
            break
    if block[start] != ord("["):
        return False
    line = block[start:].split(b"\n", 1)[0]
    while len(line) < _FIRST_LINE_LIMIT and len(line) == len(block) - start:
        more = file.read(1 << 16)  # the first line continues past this block
        if not more:
            return True  # the whole file is that one line: one array
        block += more
        line = block[start:].split(b"\n", 1)[0]
    if len(line) >= _FIRST_LINE_LIMIT:
        return True  # a JSONL line this long that is an array is no dataset; an array file is
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return True  # `[`, or `[{...},`: a line of a multi-line array
    rest = block[start + len(line) :]
    while not rest.strip(JSON_WS):
        rest = file.read(1 << 16)
        if not rest:
            return True  # `[...]` alone: an array
    return False
