"""The answer's token ids kept as the bytes the server sent: cut from the /generate body, checked there.

SGLang encodes `output_ids` with orjson as a compact array of non-negative ints (`[163606,1234,...]`).
Parsing it builds one Python int per token and frees them all after the record is written: a third of
the worker's event loop at wire speed. `WireIds` holds the array's JSON text instead and answers what
the record checks ask (length, an element, where an id occurs, how often, a short slice) with C-level
byte searches; anything else parses the array once (`tolist`). The bytes are stored as they came.

Pure functions only; the HTTP client decides what to do when `split_answer` declines (it parses the
whole body as before).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import orjson

OUTPUT_IDS_KEY = b'"output_ids"'
_PREFIX_PARSE_LIMIT = 64
"""A slice from the start up to this many ids is parsed from the front of the bytes, not the whole array."""


def compact_int_array(raw: bytes) -> int:
    """How many ids `raw` holds when it is `[]` or `[n,n,...]` with plain non-negative decimal ints (no
    spaces, signs, exponents, empty elements or leading zeros: what orjson writes); -1 otherwise.

    One vectorised pass over the bytes (numpy), several times cheaper than building the ints."""
    if len(raw) < 2 or raw[0] != 0x5B or raw[-1] != 0x5D:  # [ ]
        return -1
    if len(raw) == 2:
        return 0
    inner = np.frombuffer(raw, np.uint8, len(raw) - 2, 1)
    comma = inner == 0x2C
    digit = (inner - 0x30) < 10  # uint8 wraps below '0'
    if not (comma | digit).all() or comma[0] or comma[-1] or (comma[1:] & comma[:-1]).any():
        return -1
    zero_then_digit = (inner[:-1] == 0x30) & digit[1:]
    if (len(inner) > 1 and zero_then_digit[0]) or (
        zero_then_digit[1:] & comma[:-2]
    ).any():  # an element starting 0 must be "0"
        return -1
    return int(np.count_nonzero(comma)) + 1


class WireIds(Sequence[int]):
    """A token-id array held as its compact JSON text (`compact_int_array`); immutable."""

    __slots__ = ("_hit", "_len", "_list", "raw")

    def __init__(self, raw: bytes, length: int | None = None) -> None:
        self.raw = raw
        self._len = compact_int_array(raw) if length is None else length
        if self._len < 0:
            raise ValueError("not a compact array of non-negative ints")
        self._list: list[int] | None = None
        self._hit = (-1, -1)
        """(index, byte offset) of the last element `index` found: `ids[at:at + n]` after it is cheap."""

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"WireIds({self._len} ids)"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WireIds):
            return self.raw == other.raw
        if isinstance(other, Sequence):
            return len(other) == self._len and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def tolist(self) -> list[int]:
        if self._list is None:
            self._list = orjson.loads(self.raw)
        return self._list

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __contains__(self, value: object) -> bool:
        return self._element(value, 0) >= 0

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if self._list is not None:
            return self._list[index]
        n = self._len
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1 and stop - start <= _PREFIX_PARSE_LIMIT:
                if start >= stop:
                    return []
                if start == 0:
                    return _parse_from(self.raw, 1, stop)
                if start == self._hit[0]:
                    return _parse_from(self.raw, self._hit[1], stop - start)
            return self.tolist()[index]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("WireIds index out of range")
        raw = self.raw
        if index == n - 1:
            return int(raw[max(raw.rfind(b",", 0, len(raw) - 1), 0) + 1 : -1])
        if index == 0:
            return int(raw[1 : raw.find(b",")])
        if index == self._hit[0]:
            at = self._hit[1]
            return int(raw[at : raw.find(b",", at)])
        return self.tolist()[index]

    def _element(self, value: object, after: int) -> int:
        """Byte offset of the first `value` element starting at or after byte `after`, or -1."""
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or not self._len:
            return -1
        raw, text = self.raw, str(value).encode()
        if after <= 1 and raw.startswith(b"[" + text) and raw[len(text) + 1] in b",]":
            return 1
        # Delimited search: a middle element sits between two commas, the last one before `]`.
        at = raw.find(b"," + text + b",", max(0, after - 1))
        if at >= 0:
            return at + 1
        last = len(raw) - 1 - len(text)
        if last >= after and raw.endswith(text + b"]") and raw[last - 1] == 0x2C:
            return last
        return -1

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """Position of `value` in ids[start:stop]; ValueError when absent, as list.index."""
        n = self._len
        stop = n if stop is None else (max(0, stop + n) if stop < 0 else min(stop, n))
        start = max(0, start + n) if start < 0 else start
        if self._list is not None:
            return self._list.index(value, start, stop)
        raw, after, seen, counted_to = self.raw, 0, 0, 1
        while True:
            element = self._element(value, after)
            if element < 0:
                raise ValueError(f"{value!r} is not in the ids")
            seen += int(np.count_nonzero(np.frombuffer(raw, np.uint8, element - counted_to, counted_to) == 0x2C))
            counted_to = element
            if seen >= stop:
                raise ValueError(f"{value!r} is not in the ids")
            if seen >= start:
                self._hit = (seen, element)
                return seen
            after = element + 1  # past this element's first digit: the next match is a later element

    def count(self, value: Any) -> int:
        if self._list is not None:
            return self._list.count(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or not self._len:
            return 0
        raw, text = self.raw, str(value).encode()
        middle = b"," + text + b","
        hits = raw.count(middle)
        # Adjacent equal ids share a comma and the non-overlapping count misses every second one.
        if hits and (middle + text + b",") in raw:
            return self.tolist().count(value)
        first = raw.startswith(b"[" + text) and raw[len(text) + 1] in b",]"
        last = self._len > 1 and raw.endswith(b"," + text + b"]")
        return hits + first + last


def _parse_from(raw: bytes, at: int, count: int) -> list[int]:
    """`count` ids starting at byte `at` (an element's first digit)."""
    parts = raw[at:-1].split(b",", count)
    return [int(part) for part in parts[:count]]


def cut_array(body: bytes, key: bytes = OUTPUT_IDS_KEY) -> tuple[bytes, int, bytes] | None:
    """(the array's bytes, its length, the body with the array replaced by `[]`) when `key`'s value is a compact int
    array; None otherwise. The caller parses the rest and checks its `key` is `[]`: that proves the cut
    was the real key, not text inside a string."""
    at = body.find(key)
    if at < 0:
        return None
    start = at + len(key)
    if body[start : start + 1] != b":":
        return None
    start += 1
    if body[start : start + 1] != b"[":
        return None
    end = body.find(b"]", start)
    if end < 0:
        return None
    raw = body[start : end + 1]
    length = compact_int_array(raw)
    if length < 0:
        return None
    return raw, length, body[:start] + b"[]" + body[end + 1 :]


def split_answer(body: bytes) -> tuple[WireIds, dict[str, Any]] | None:
    """A non-streaming /generate answer as (output_ids as bytes, the rest of the answer parsed), or None
    when the fast path does not apply (the caller then parses the whole body)."""
    cut = cut_array(body)
    if cut is None:
        return None
    raw, length, rest = cut
    try:
        obj = orjson.loads(rest)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    if not isinstance(obj, dict) or obj.get("output_ids") != []:
        return None
    return WireIds(raw, length), obj


def join(parts: Iterable[WireIds | Sequence[int]]) -> WireIds:
    """Disjoint deltas (incremental streaming) as one array, joined as bytes."""
    inner = [
        part.raw[1:-1] if isinstance(part, WireIds) else orjson.dumps(list(part))[1:-1] for part in parts if len(part)
    ]
    return WireIds(b"[" + b",".join(inner) + b"]")
