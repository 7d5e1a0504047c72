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
                          an atomic rename: without it the other two are ignored (a preflight killed mid-way).
                          Also `start`: what the preflight knew with the real tokenizer that a worker needs to
                          send (its sampling with the stop ids, the chat template's sha256), under `start_key`

A worker holds each entry to the line it read (its hash), so an edited line is never sent with stale ids; later
turns of a conversation depend on the model's answers and are rendered by the workers. Memory: a reader reads
one line's ids per call (`os.pread`), never the whole file.

`render_identity` needs the tokenizer loaded (transformers: most of a worker's start-up); `start_key` is read from
files alone. The same files, settings and library versions give the same template, ids and stop ids, so a worker
whose `start_key` matches sends the stored ids before it imports transformers, and holds the store to
`render_identity` once it has (`RenderedPrompts.differences`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from datagen_operator.engine.model_configs import MODEL_CONFIG_FILES, model_config_dir
from datagen_operator.output.fingerprint import chat_template_sha256, sha256_bytes, tokenizer_fingerprint
from datagen_operator.output.layout import OutputLayout, write_atomic

if TYPE_CHECKING:
    from datagen_operator.api.resolve import ResolvedModel
    from datagen_operator.api.spec import DataGenRunSpec

IDS_FILE = "ids.u32"
LINES_FILE = "lines.bin"
META_FILE = "meta.json"
FORMAT = 1

LINE_DTYPE = np.dtype([("offset", "<u8"), ("count", "<i4"), ("hash", "<u8")])
"""One dataset line: where its ids start (in tokens), how many (-1: none rendered), its line hash."""
NOT_RENDERED = -1
RENDER_LIBRARIES = ("transformers", "tokenizers", "jinja2", "datagen-operator")
"""What loads the tokenizer and renders the template (their installed versions, read without importing them)."""


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


def start_key(
    spec: DataGenRunSpec, resolved: ResolvedModel, tokenizer_dir: Path, variables: dict[str, Any]
) -> dict[str, Any]:
    """What a line's first request and the run's sampling depend on, read from files and the spec only (no
    transformers): the tokenizer's files (its template among them), the model configs whose eos ids are stop ids
    (config.json beside the tokenizer too: AutoTokenizer may read it), the run's template variables, turns and
    history, the settings the stop set and sampling come from, and the versions of the libraries that render."""
    generation, tokenizer_dir = spec.generation, Path(tokenizer_dir)
    model_dir = model_config_dir(spec.model.path, tokenizer_dir)
    configs = {f"model/{name}": model_dir / name for name in MODEL_CONFIG_FILES} if model_dir is not None else {}
    configs["tokenizer/config.json"] = tokenizer_dir / "config.json"
    preset = resolved.preset
    settings = {
        "preset": preset.name if preset is not None else None,
        "parsers": [resolved.reasoning_parser, resolved.tool_call_parser],
        "thinking": [resolved.thinking, resolved.think_start, resolved.think_end],
        "trust_remote_code": resolved.trust_remote_code,
        "sampling": generation.sampling.model_dump(mode="json", exclude_none=True),
    }
    return {
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer_dir)["sha256"],
        "configs": {name: _file_sha256(path) for name, path in configs.items()},
        "variables": orjson.loads(orjson.dumps(variables, default=str, option=orjson.OPT_SORT_KEYS)),
        "turns": generation.turns,
        "history_reasoning": generation.history_reasoning,
        "settings": settings,
        "versions": {name: _version(name) for name in RENDER_LIBRARIES},
    }


def start_values(sampling: dict[str, Any], chat_template: Any) -> dict[str, Any]:
    """What a worker sends and claims the output with that only the tokenizer knows: the sampling every request
    carries (its stop ids) and the chat template's sha256 (the data fingerprint's)."""
    return {"sampling": sampling, "chat_template_sha256": chat_template_sha256(chat_template)}


def _file_sha256(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


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

    def finish(
        self, lines_total: int, identity: dict[str, Any], pin_sha256: str, start: dict[str, Any] | None = None
    ) -> None:
        """Seal the store for a dataset of `lines_total` lines, rendered by `identity`, pinned as `pin_sha256`;
        `start`: {"key": `start_key`, **`start_values`}, what a worker sends before its tokenizer is loaded."""
        if lines_total > self.lines:
            self.add(lines_total - 1, 0, None)
        self._flush_lines()
        self._ids.flush()
        os.fsync(self._ids.fileno())
        self._ids.close()
        table = np.concatenate(self._lines) if self._lines else np.zeros(0, dtype=LINE_DTYPE)
        write_atomic(self.dir / LINES_FILE, table.tobytes())
        meta = {"format": FORMAT, "identity": identity, "pin_sha256": pin_sha256, "lines": len(table),
                "tokens": self.tokens, **({"start": start} if start is not None else {})}  # fmt: skip
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
    meta: dict[str, Any] = field(default_factory=dict)
    """meta.json as the preflight sealed it."""

    @property
    def start(self) -> dict[str, Any]:
        """What the preflight stored for a worker to send before its tokenizer is loaded (`start_values`)."""
        start: dict[str, Any] = self.meta.get("start") or {}
        return start

    def differences(self, identity: dict[str, Any], values: dict[str, Any]) -> list[str]:
        """What differs between the store and this worker's own `render_identity` and `start_values` (computed
        once its tokenizer is loaded): [] when the ids and sampling sent before then are the worker's own."""
        stored: dict[str, Any] = self.meta.get("identity") or {}
        start = {key: self.start.get(key) for key in values}
        return sorted({*_differing(stored, identity), *_differing(start, values)})

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
    return _open(output, pin_sha256, lambda meta: _changed(meta.get("identity") or {}, identity, "rendered"))


def open_rendered_early(output: Path, key: dict[str, Any], pin_sha256: str | None) -> RenderedPrompts | str:
    """The store of this output if the preflight rendered it under `start_key` `key` (and stored what a worker
    sends before its tokenizer is loaded), from the dataset pinned as `pin_sha256`, or why not."""
    return _open(output, pin_sha256, lambda meta: _changed((meta.get("start") or {}).get("key") or {}, key, "ran"))


def _changed(stored: dict[str, Any], own: dict[str, Any], verb: str) -> str | None:
    if stored == own:
        return None
    return f"the preflight {verb} with another {', '.join(_differing(stored, own))}"


def _differing(stored: dict[str, Any], own: dict[str, Any]) -> list[str]:
    """The keys whose values differ between the two (a key missing on one side differs)."""
    return sorted(key for key in {*own, *stored} if stored.get(key) != own.get(key))


def _open(output: Path, pin_sha256: str | None, judge: Callable[[dict[str, Any]], str | None]) -> RenderedPrompts | str:
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
    why_not = judge(meta)
    if why_not is not None:
        return why_not
    try:
        lines = np.frombuffer((directory / LINES_FILE).read_bytes(), dtype=LINE_DTYPE)
        fd = os.open(directory / IDS_FILE, os.O_RDONLY)
    except OSError as error:
        return f"rendered prompts unreadable ({error})"
    size = os.fstat(fd).st_size
    if len(lines) != meta.get("lines") or size != 4 * int(meta.get("tokens", -1)):
        os.close(fd)
        return "rendered prompts incomplete (their files disagree with meta.json)"
    return RenderedPrompts(lines, fd, int(meta["tokens"]), meta)
