"""Token runs with cached encodings: outputs are a few slices of precomputed sources, not token lists.

A 4,000-token answer is one or two slices of a corpus whose ids, decoded bytes and JSON digits were
computed once at start. Truncating, searching for stop ids, decoding to text and writing `output_ids`
JSON then cost a few C-level slices and joins instead of per-token Python work: the simulator must
serve far more tokens per second than the client under test can consume.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def _offsets(pieces: Iterable[bytes]) -> array[int]:
    offsets = array("Q", [0])
    total = 0
    for piece in pieces:
        total += len(piece)
        offsets.append(total)
    return offsets


@dataclass(frozen=True, slots=True, eq=False)
class TokenSource:
    """A token sequence with its encodings: ids, uint32 bytes, decoded bytes (with and without special
    tokens), and comma-terminated JSON digits, each with per-token offsets."""

    ids: list[int]
    id_bytes: bytes
    raw: bytes
    raw_offsets: array[int]
    text: bytes
    text_offsets: array[int]
    json: bytes
    json_offsets: array[int]
    distinct_ids: frozenset[int]
    """Lets a stop-id search skip sources that cannot contain the id (corpora hold no special ids)."""

    @classmethod
    def build(cls, ids: Sequence[int], token_bytes: Sequence[bytes], text_bytes: Sequence[bytes]) -> TokenSource:
        ids = list(ids)
        raw_pieces = [token_bytes[token_id] for token_id in ids]
        text_pieces = [text_bytes[token_id] for token_id in ids]
        json_pieces = [b"%d," % token_id for token_id in ids]
        return cls(
            ids=ids,
            id_bytes=array("I", ids).tobytes(),
            raw=b"".join(raw_pieces),
            raw_offsets=_offsets(raw_pieces),
            text=b"".join(text_pieces),
            text_offsets=_offsets(text_pieces),
            json=b"".join(json_pieces),
            json_offsets=_offsets(json_pieces),
            distinct_ids=frozenset(ids),
        )

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class Span:
    source: TokenSource
    start: int
    stop: int

    def find(self, token_id: int, from_index: int = 0) -> int:
        """Index (relative to the span) of the first `token_id` at or after `from_index`, or -1."""
        if token_id not in self.source.distinct_ids:
            return -1
        needle = token_id.to_bytes(4, "little")
        data = self.source.id_bytes
        begin, end = 4 * (self.start + from_index), 4 * self.stop
        position = data.find(needle, begin, end)
        while position != -1 and position % 4:
            position = data.find(needle, position + 1, end)
        return -1 if position == -1 else position // 4 - self.start


class TokenRun:
    """An immutable sequence of spans; the simulator's representation of output tokens."""

    __slots__ = ("_length", "spans")

    def __init__(self, spans: Iterable[Span] = ()) -> None:
        self.spans: tuple[Span, ...] = tuple(span for span in spans if span.stop > span.start)
        self._length = sum(span.stop - span.start for span in self.spans)

    @classmethod
    def of(cls, source: TokenSource) -> TokenRun:
        return cls((Span(source, 0, len(source)),))

    def __len__(self) -> int:
        return self._length

    @classmethod
    def concat(cls, runs: Iterable[TokenRun]) -> TokenRun:
        run = cls.__new__(cls)
        runs = tuple(runs)
        run.spans = tuple(span for part in runs for span in part.spans)
        run._length = sum(part._length for part in runs)
        return run

    def __add__(self, other: TokenRun) -> TokenRun:
        return TokenRun.concat((self, other))

    def prefix(self, count: int) -> TokenRun:
        if count >= self._length:
            return self
        spans: list[Span] = []
        remaining = count
        for span in self.spans:
            if remaining <= 0:
                break
            size = span.stop - span.start
            spans.append(span if size <= remaining else Span(span.source, span.start, span.start + remaining))
            remaining -= size
        return TokenRun(spans)

    def find_first(self, token_ids: Iterable[int], from_index: int = 0) -> tuple[int, int] | None:
        """(index, id) of the earliest occurrence of any of `token_ids` at or after `from_index`."""
        wanted = tuple(token_ids)
        offset = 0
        for span in self.spans:
            size = span.stop - span.start
            if from_index < offset + size:
                local_from = max(0, from_index - offset)
                hits = [(index, token_id) for token_id in wanted if (index := span.find(token_id, local_from)) != -1]
                if hits:
                    index, token_id = min(hits)
                    return offset + index, token_id
            offset += size
        return None

    def ids(self) -> list[int]:
        out: list[int] = []
        for span in self.spans:
            out += span.source.ids[span.start : span.stop]
        return out

    def decoded_bytes(self, skip_special_tokens: bool = True) -> bytes:
        parts = []
        for span in self.spans:
            source = span.source
            if skip_special_tokens:
                parts.append(source.text[source.text_offsets[span.start] : source.text_offsets[span.stop]])
            else:
                parts.append(source.raw[source.raw_offsets[span.start] : source.raw_offsets[span.stop]])
        return b"".join(parts)

    def text(self, skip_special_tokens: bool = True) -> str:
        return self.decoded_bytes(skip_special_tokens).decode("utf-8", "replace")

    def json_ids(self) -> bytes:
        """The ids as JSON array elements without brackets: b'1,2,3' (b'' when empty)."""
        parts = [
            span.source.json[span.source.json_offsets[span.start] : span.source.json_offsets[span.stop]]
            for span in self.spans
        ]
        return b"".join(parts)[:-1]
