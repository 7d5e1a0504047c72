"""A JSON array file's elements, streamed: each element's exact byte span found by bracket depth outside
strings (the elements' own syntax left to orjson), and where the array breaks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from datagen_operator.prompts.dataset_ref import JSON_WS, UTF8_BOM, UTF16_BOMS, DatasetError
from datagen_operator.prompts.lines import excerpt

JSON_CHUNK_SIZE = 1 << 20
"""Bytes read at a time from a JSON array file (a module global, so a test can make elements span reads)."""
_NOT_WS = re.compile(rb"[^ \t\r\n]")
# Only brackets and commas outside strings delimit elements. One match skips, in C, every other byte and every
# whole string (possessive: no backtracking), then takes one of: an opening bracket (group 1), a closing one (2),
# a comma (3), the quote of a string the read ends inside (4), or the read's end (no group).
_ARRAY_TOKEN = re.compile(rb'(?:[^"\[\]{},]++|"(?:[^"\\]++|\\.)*+")*+(?:([\[{])|([\]}])|(,)|(")|\Z)', re.DOTALL)
# The rest of a string a read ended inside: group 1 is its closing quote, absent when this read ends in it too.
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+(")?', re.DOTALL)
_OPENS, _CLOSES, _COMMA, _OPEN_STRING = 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class ArrayBreak:
    """Where a JSON array stops being readable: everything from `offset` on is one line set aside (bad_json)."""

    offset: int
    reason: str
    excerpt: bytes


def iter_json_array(
    file: IO[bytes], path: Path | str = "", chunk_size: int | None = None
) -> Iterator[tuple[int, bytes, Any] | ArrayBreak]:
    """The elements of the JSON array in `file` (open binary, at its start), streamed `chunk_size` bytes at a
    time (default JSON_CHUNK_SIZE): (offset, bytes, parsed value) per element, its byte span exact, and last an
    ArrayBreak where the array is truncated or invalid. Memory: one read and the element being read."""
    for index, span in enumerate(_ArraySpans(file, path, chunk_size or JSON_CHUNK_SIZE)):
        if isinstance(span, ArrayBreak):
            yield span
            return
        offset, data = span
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            yield ArrayBreak(
                offset,
                f"bad JSON: the array breaks at element {index + 1} (byte offset {offset}): {error}; it and "
                "everything after it are set aside",
                data[:200],
            )
            return
        yield offset, data, value


class _ArraySpans:
    """Each top-level element's (offset, bytes) of a JSON array, by bracket depth outside strings (the elements'
    own syntax is left to orjson), then an ArrayBreak if it breaks. `buf` holds the current element's bytes and
    one read; `base` is the file offset of buf[0]."""

    def __init__(self, file: IO[bytes], path: Path | str, chunk_size: int) -> None:
        self.file, self.path, self.chunk_size = file, path, chunk_size
        self.buf = b""
        self.base = 0
        self.eof = False

    def fill(self, keep: int) -> bool:
        """Drop buf[:keep] and append one read; False at the end of the file. A read is at least as long as
        what is kept, so an element of many reads is copied a bounded number of times, not once per read."""
        chunk = b"" if self.eof else self.file.read(max(self.chunk_size, len(self.buf) - keep))
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[keep:] + chunk
        self.base += keep
        return True

    def next_text(self, pos: int) -> int | None:
        """The position of the next non-whitespace byte from `pos` (reading on), None at the end of the file."""
        while (found := _NOT_WS.search(self.buf, pos)) is None:
            if not self.fill(len(self.buf)):
                return None
            pos = 0
        return found.start()

    def __iter__(self) -> Iterator[tuple[int, bytes] | ArrayBreak]:
        while len(self.buf) < len(UTF8_BOM) and self.fill(0):
            pass
        if self.buf[:2] in UTF16_BOMS:
            raise DatasetError(f"dataset {self.path} is UTF-16 (byte order mark); JSON must be UTF-8")
        pos = self.next_text(len(UTF8_BOM) if self.buf.startswith(UTF8_BOM) else 0)
        if pos is None:
            return  # nothing but whitespace: no element
        buf = self.buf
        if buf[pos : pos + 1] != b"[":
            raise DatasetError(
                f"dataset {self.path} is not a JSON array: it starts with {excerpt(buf[pos : pos + 40])!r} at byte "
                f"offset {self.base + pos}; format json is one array of conversations (one a line is format jsonl)"
            )
        pos += 1
        start = pos  # where the current element's bytes begin (after `[` or a `,`)
        depth = 1
        count = 0
        in_string = False
        token = _ARRAY_TOKEN.match
        while True:
            if in_string:
                rest = _STRING_REST.match(buf, pos)
                assert rest is not None  # it matches the empty string
                pos = rest.end()
                in_string = rest.group(1) is None
            while not in_string:
                match = token(buf, pos)
                assert match is not None  # it matches at the read's end
                pos = match.end()
                kind = match.lastindex
                if kind == _COMMA:
                    if depth == 1:
                        yield self._span(start, pos - 1)
                        count += 1
                        start = pos
                elif kind == _OPENS:
                    depth += 1
                elif kind == _CLOSES:
                    if depth > 1:
                        depth -= 1
                        continue
                    at = pos - 1
                    if buf[at] != ord("]"):
                        yield self._break(start, count, f"a }} at byte offset {self.base + at} closes nothing")
                        return
                    offset, data = self._span(start, at)
                    if data or count:
                        yield offset, data  # `[]` has no element; `[1,]` an empty one (orjson refuses it)
                        count += 1
                    after = self.next_text(pos)
                    if after is not None:
                        offset = self.base + after
                        yield ArrayBreak(
                            offset,
                            f"bad JSON: text after the array's closing ] at byte offset {offset}; set aside as "
                            f"element {count + 1}",
                            self.buf[after : after + 200],
                        )
                    return
                elif kind == _OPEN_STRING:
                    in_string = True
                else:
                    break  # the read's end
            # The read ended inside an element: keep its bytes, read on.
            if not self.fill(start):
                end = self.base + len(buf)
                yield self._break(
                    start, count, f"the array ends at byte offset {end} before its closing ] (truncated?)"
                )
                return
            buf = self.buf
            pos -= start
            start = 0

    def _span(self, start: int, end: int) -> tuple[int, bytes]:
        """The element between separators, its surrounding whitespace cut: (file offset, bytes)."""
        data = self.buf[start:end]
        stripped = data.lstrip(JSON_WS)
        return self.base + start + len(data) - len(stripped), stripped.rstrip(JSON_WS)

    def _break(self, start: int, count: int, what: str) -> ArrayBreak:
        offset, _ = self._span(start, len(self.buf))
        excerpt = self.buf[offset - self.base : offset - self.base + 200]
        return ArrayBreak(
            offset,
            f"bad JSON: the array breaks at element {count + 1} (byte offset {offset}): {what}; it and everything "
            "after it are set aside",
            excerpt,
        )
