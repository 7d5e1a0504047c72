"""Which dataset file a reader reads and as what: its format (declared, or detected from the file), and the
errors of a dataset that cannot be read at all."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Literal

import orjson

DatasetFormat = Literal["auto", "jsonl", "json", "parquet"]
ReadFormat = Literal["jsonl", "json", "parquet"]

UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
JSON_WS = b" \t\r\n"
"""JSON's whitespace."""


class DatasetError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


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
