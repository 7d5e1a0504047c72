"""Append-only JSONL segments: scanning, sealing (the .keys.json index) and crash recovery of one segment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.progress import Counts
from datagen_operator.output.layout import keys_path, record_key, write_atomic

# --- segments --------------------------------------------------------------------------------------


@dataclass
class SegmentScan:
    entries: list[tuple[str, int, int, int, int]]
    """(id, sample, turn, byte offset, byte length) of each valid record line."""
    summary: Counts
    valid_bytes: int
    """Length of the prefix that ends with the last complete line."""
    torn_bytes: int
    corrupt_lines: int


def complete_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(offset, line without newline) for each newline-terminated line; a trailing partial line is skipped."""
    start = 0
    end = data.find(b"\n", start)
    while end != -1:
        yield start, data[start:end]
        start = end + 1
        end = data.find(b"\n", start)


def parse_record_line(line: bytes) -> dict[str, Any] | None:
    """A record from a segment line, or None if the line is damaged (e.g. zeros after a power loss)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("id"), str)
        or not isinstance(record.get("sample"), int)
        or not isinstance(record.get("turn", 0), int)
        or not isinstance(record.get("output_ids"), list)
        or not isinstance(record.get("input_ids"), list)
    ):
        return None
    return record


def scan_segment_bytes(data: bytes) -> SegmentScan:
    entries: list[tuple[str, int, int, int, int]] = []
    summary = Counts()
    corrupt = 0
    valid_bytes = data.rfind(b"\n") + 1
    for offset, line in complete_lines(data):
        if not line.strip():
            continue
        record = parse_record_line(line)
        if record is None:
            corrupt += 1
            continue
        entries.append((*record_key(record), offset, len(line) + 1))
        summary.add_record(record)
    return SegmentScan(entries, summary, valid_bytes, len(data) - valid_bytes, corrupt)


def load_sealed_keys(segment: Path) -> SegmentScan | None:
    """The keys file of a sealed segment, if it matches the segment's current size."""
    try:
        data = orjson.loads(keys_path(segment).read_bytes())
        size = segment.stat().st_size
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if data.get("bytes") != size:
        return None
    entries = [_entry(entry) for entry in data["entries"]]
    return SegmentScan(entries, Counts.from_storage(data["summary"]), size, 0, data.get("corrupt_lines", 0))


def _entry(entry: list[Any]) -> tuple[str, int, int, int, int]:
    """A keys-file entry; one of four values (id, sample, offset, length) was sealed before records had turns."""
    if len(entry) == 4:
        return (entry[0], entry[1], 0, entry[2], entry[3])
    return (entry[0], entry[1], entry[2], entry[3], entry[4])


def seal_segment(segment: Path, scan: SegmentScan) -> None:
    body = {
        "bytes": scan.valid_bytes,
        "entries": scan.entries,
        "summary": scan.summary.for_storage(),
        "corrupt_lines": scan.corrupt_lines,
    }
    write_atomic(keys_path(segment), orjson.dumps(body))


def recover_segment(segment: Path) -> SegmentScan:
    """Seal a segment a previous run left behind: drop a torn tail, index its records."""
    sealed = load_sealed_keys(segment)
    if sealed is not None:
        return sealed
    data = segment.read_bytes()
    scan = scan_segment_bytes(data)
    if scan.torn_bytes:
        with segment.open("r+b") as file:
            file.truncate(scan.valid_bytes)
            os.fsync(file.fileno())
    seal_segment(segment, scan)
    return scan


def segment_records(segment: Path) -> Iterator[dict[str, Any]]:
    """Records of one segment, read-only: a partial last line (still being written) is skipped."""
    try:
        data = segment.read_bytes()
    except FileNotFoundError:
        return  # removed by a compaction that just finished
    for _, line in complete_lines(data):
        record = parse_record_line(line)
        if record is not None:
            yield record
