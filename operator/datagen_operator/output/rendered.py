"""The prompts the preflight rendered, kept with the output so the workers send those very ids.

Rendering (Jinja + tokenization) is the preflight's largest cost, and the workers used to pay it a second time
for every prompt. The preflight renders each line's first request once, judges those ids (too long, set aside)
and writes them here; a worker whose renderer is the same (`render_identity`) reads a line's ids instead of
rendering it. What the preflight judged and what the workers send are then the same bytes by construction.

Layout, in the output directory:

    rendered/ids.u32      every rendered prompt's token ids, concatenated (uint32, little-endian)
    rendered/lines.bin    one entry a dataset line (position): token offset, token count (-1: not rendered), the
                          line's hash (prompts/pin.py `prompt_hash`, as the pin and each record hold it)
    rendered/meta.json    what rendered them (`render_identity`) and the dataset pin's sha256; written last, by
                          an atomic rename: without it the other two are ignored (a preflight killed mid-way)

A worker holds each entry to the line it read (its hash), so an edited line is never sent with stale ids; later
turns of a conversation depend on the model's answers and are rendered by the workers. Memory: a reader reads
one line's ids per call (`os.pread`), never the whole file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from datagen_operator.output.fingerprint import chat_template_sha256, tokenizer_fingerprint
from datagen_operator.output.layout import OutputLayout, write_atomic

IDS_FILE = "ids.u32"
LINES_FILE = "lines.bin"
META_FILE = "meta.json"
FORMAT = 1

LINE_DTYPE = np.dtype([("offset", "<u8"), ("count", "<i4"), ("hash", "<u8")])
"""One dataset line: where its ids start (in tokens), how many (-1: none rendered), its line hash."""
NOT_RENDERED = -1


def render_identity(
    template: Any, variables: dict[str, Any], tokenizer_dir: Path, turns: str, *, history_reasoning: str
) -> dict[str, Any]:
    """Everything the ids of a line depend on besides the line: the template as it renders (its clock pinned),
    the run's template variables, the tokenizer's files, which request of a line is rendered and what history
    it sends (generation.historyReasoning, when `drop`: a dataset's assistant messages lose their reasoning)."""
    return {
        "chat_template_sha256": chat_template_sha256(template),
        "variables": orjson.loads(orjson.dumps(variables, default=str, option=orjson.OPT_SORT_KEYS)),
        "tokenizer_sha256": tokenizer_fingerprint(Path(tokenizer_dir))["sha256"],
        "turns": turns,
        **({"history_reasoning": history_reasoning} if history_reasoning != "keep" else {}),
    }


class RenderedWriter:
    """Writes the store line by line in dataset order; `finish` makes it visible (meta.json last)."""

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.dir = OutputLayout(Path(output)).rendered
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / META_FILE).unlink(missing_ok=True)  # invisible while rewritten
        self._ids = (self.dir / IDS_FILE).open("wb")
        self._lines: list[np.ndarray[Any, Any]] = []
        self._pending: list[tuple[int, int, int]] = []
        self.tokens = 0
        self.lines = 0

    def add(self, position: int, line_hash: int, ids: bytes | None) -> None:
        """A line's rendered ids (int32 bytes, as the render helpers return them), or None: not rendered.
        Positions only grow; lines never added (not prompts) read as not rendered."""
        if position < self.lines:
            raise ValueError(f"rendered store: line {position} after line {self.lines - 1}")
        self._pending.extend([(0, NOT_RENDERED, 0)] * (position - self.lines))
        if ids is None:
            self._pending.append((0, NOT_RENDERED, line_hash))
        else:
            count = len(ids) // 4
            self._pending.append((self.tokens, count, line_hash))
            self._ids.write(ids)  # int32 and uint32 share their bytes for token ids (< 2**31)
            self.tokens += count
        self.lines = position + 1
        if len(self._pending) >= 65536:
            self._flush_lines()

    def _flush_lines(self) -> None:
        if self._pending:
            self._lines.append(np.array(self._pending, dtype=LINE_DTYPE))
            self._pending = []

    def finish(self, lines_total: int, identity: dict[str, Any], pin_sha256: str) -> None:
        """Seal the store for a dataset of `lines_total` lines, rendered by `identity`, pinned as `pin_sha256`."""
        if lines_total > self.lines:
            self.add(lines_total - 1, 0, None)
        self._flush_lines()
        self._ids.flush()
        os.fsync(self._ids.fileno())
        self._ids.close()
        table = np.concatenate(self._lines) if self._lines else np.zeros(0, dtype=LINE_DTYPE)
        write_atomic(self.dir / LINES_FILE, table.tobytes())
        meta = {"format": FORMAT, "identity": identity, "pin_sha256": pin_sha256, "lines": len(table),
                "tokens": self.tokens}  # fmt: skip
        write_atomic(self.dir / META_FILE, orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))

    def abandon(self) -> None:
        """A preflight that refused: nothing is kept (a later preflight renders again)."""
        if not self._ids.closed:
            self._ids.close()
        remove_rendered(self.dir.parent)

    def line_hashes(self) -> np.ndarray[Any, Any]:
        """The hashes of the lines added so far (for the caller's check against the pin)."""
        self._flush_lines()
        if not self._lines:
            return np.zeros(0, dtype="<u8")
        return np.concatenate(self._lines)["hash"]


def remove_rendered(output: Path) -> None:
    directory = OutputLayout(Path(output)).rendered
    for name in (META_FILE, LINES_FILE, IDS_FILE):
        (directory / name).unlink(missing_ok=True)


@dataclass
class RenderedPrompts:
    """A sealed store, open for reading: `ids(position, line_hash)` gives that line's rendered ids (int32 bytes)
    when the store holds them for a line with that hash, else None (render it)."""

    lines: np.ndarray[Any, Any]
    fd: int
    tokens: int

    def ids(self, position: int, line_hash: int) -> bytes | None:
        if not 0 <= position < len(self.lines):
            return None
        offset, count, stored_hash = self.lines[position]
        if count < 0 or int(stored_hash) != line_hash:
            return None
        return os.pread(self.fd, int(count) * 4, int(offset) * 4)

    def close(self) -> None:
        os.close(self.fd)


def open_rendered(output: Path, identity: dict[str, Any], pin_sha256: str | None) -> RenderedPrompts | str:
    """The store of this output if it was rendered by `identity` from the dataset pinned as `pin_sha256`, or why
    not (a sentence for the log: the caller renders itself)."""
    directory = OutputLayout(Path(output)).rendered
    try:
        meta = orjson.loads((directory / META_FILE).read_bytes())
    except FileNotFoundError:
        return "no prompts rendered by the preflight"
    except (OSError, orjson.JSONDecodeError) as error:
        return f"{directory / META_FILE} is unreadable ({error})"
    if meta.get("format") != FORMAT:
        return f"rendered prompts of format {meta.get('format')!r}, not {FORMAT}"
    if pin_sha256 is None or meta.get("pin_sha256") != pin_sha256:
        return "the preflight rendered another version of the dataset"
    rendered_by = meta.get("identity") or {}
    if rendered_by != identity:
        changed = sorted(k for k in {*identity, *rendered_by} if rendered_by.get(k) != identity.get(k))
        return f"the preflight rendered with another {', '.join(changed)}"
    try:
        lines = np.frombuffer((directory / LINES_FILE).read_bytes(), dtype=LINE_DTYPE)
        fd = os.open(directory / IDS_FILE, os.O_RDONLY)
    except OSError as error:
        return f"rendered prompts unreadable ({error})"
    size = os.fstat(fd).st_size
    if len(lines) != meta.get("lines") or size != 4 * int(meta.get("tokens", -1)):
        os.close(fd)
        return "rendered prompts incomplete (their files disagree with meta.json)"
    return RenderedPrompts(lines, fd, int(meta["tokens"]))
