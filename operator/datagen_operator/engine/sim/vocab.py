"""The simulator's view of a tokenizer directory: byte tables for fast decoding, Kimi ids, text corpora.

Loaded once at start (imperative); everything after is read-only data for the pure model. Uses the
`tokenizers` library directly (importing transformers costs seconds), and caches what it derives from
a tokenizer.json (per-id bytes, the corpora's token ids) in a marshal file keyed by the file's hash, so
a server starts in about a second; the tokenizer itself loads on first use (text prompts, chat).
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import tempfile
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from tokenizers import Tokenizer

from datagen_operator.engine.sim.tokens import TokenRun, TokenSource
from datagen_operator.tokenizer import corpus, kimi_tokens

CORPUS_SENTENCES = 2500  # about 40k tokens per corpus; outputs longer than that wrap around
TABLES_FORMAT = 1
CACHE_ENV = "DATAGEN_SIM_CACHE"
_REQUIRED_TOKENS = (
    kimi_tokens.IM_END, kimi_tokens.IM_SYSTEM, kimi_tokens.IM_MIDDLE, kimi_tokens.THINK, kimi_tokens.THINK_END,
    kimi_tokens.TOOL_CALLS_SECTION_BEGIN, kimi_tokens.TOOL_CALLS_SECTION_END, kimi_tokens.TOOL_CALL_BEGIN,
    kimi_tokens.TOOL_CALL_ARGUMENT_BEGIN, kimi_tokens.TOOL_CALL_END,
)  # fmt: skip


class VocabError(RuntimeError):
    """The tokenizer directory cannot serve the simulator."""


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


@dataclass(frozen=True, slots=True)
class Corpus:
    """A long token sequence cut into sentences; outputs are slices of it starting at a sentence."""

    source: TokenSource
    sentence_starts: list[int]


class _LazyTokenizer:
    """The `tokenizers.Tokenizer`, parsed on first use (0.2 s for a 163k vocabulary)."""

    def __init__(self, tokenizer_json: str) -> None:
        self._json: str | None = tokenizer_json
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()

    def get(self) -> Tokenizer:
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    assert self._json is not None
                    self._tokenizer = Tokenizer.from_str(self._json)
                    self._json = None
        return self._tokenizer


@dataclass(frozen=True)
class SimVocab:
    lazy_tokenizer: _LazyTokenizer
    chat_template: str | None
    token_bytes: tuple[bytes, ...]
    """Every id's bytes, special tokens as their content."""
    text_bytes: tuple[bytes, ...]
    """The same with special tokens as b"" (decoding with skip_special_tokens)."""
    size: int
    think_id: int
    think_end_id: int
    im_end_id: int
    eos_ids: frozenset[int]
    """Ids that end generation unless ignore_eos: <|im_end|>, config eos_token_id(s), the tokenizer's eos."""
    tool_section_begin_id: int
    tool_section_end_id: int
    tool_call_begin_id: int
    tool_call_argument_begin_id: int
    tool_call_end_id: int
    tool_declare_marker: tuple[int, ...]
    """The ids of `<|im_system|>tool_declare<|im_middle|>`: the template's tool declaration header."""
    reasoning: Corpus
    answer: Corpus
    model_config: dict[str, Any]
    _singles: dict[int, TokenRun] = field(default_factory=dict, repr=False)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.lazy_tokenizer.get()

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        table = self.text_bytes if skip_special_tokens else self.token_bytes
        return b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace")

    @cached_property
    def marker_bytes(self) -> bytes:
        return array("I", self.tool_declare_marker).tobytes()

    def source(self, ids: Sequence[int]) -> TokenSource:
        """A token source for ids not from a corpus (tool calls, tags); small, built per use."""
        return TokenSource.build(ids, self.token_bytes, self.text_bytes)

    def single(self, token_id: int) -> TokenRun:
        """A one-token run, cached (the think and end tokens occur in every output)."""
        run = self._singles.get(token_id)
        if run is None:
            run = self._singles[token_id] = TokenRun.of(self.source([token_id]))
        return run

    def run(self, ids: Sequence[int]) -> TokenRun:
        return TokenRun.of(self.source(ids))


def _vocab_items(tokenizer: Tokenizer, document: dict[str, Any]) -> Any:
    model_vocab = document.get("model", {}).get("vocab")
    if isinstance(model_vocab, dict):  # BPE / WordPiece: read from the parsed file, faster than get_vocab()
        return [*model_vocab.items(), *((token["content"], token["id"]) for token in document["added_tokens"])]
    return tokenizer.get_vocab(with_added_tokens=True).items()


def _byte_tables(tokenizer: Tokenizer, document: dict[str, Any]) -> tuple[list[bytes], list[bool]]:
    """Per id: its bytes (special tokens as their content) and whether it is special."""
    byte_decoder = _gpt2_byte_decoder()
    added = tokenizer.get_added_tokens_decoder()
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    token_bytes: list[bytes] = [b""] * size
    special: list[bool] = [False] * size
    for token, token_id in _vocab_items(tokenizer, document):
        if token_id >= size:
            continue
        if token_id in added:
            token_bytes[token_id] = added[token_id].content.encode("utf-8")
            special[token_id] = added[token_id].special
        elif token.isascii():  # byte-level tokens hold only '!'..'~' in ASCII, and those map to themselves
            token_bytes[token_id] = token.encode("ascii")
        else:
            try:
                token_bytes[token_id] = bytes(map(byte_decoder.__getitem__, token))
            except KeyError:  # not a byte-level vocabulary: ask the tokenizer (slower, load time only)
                token_bytes[token_id] = tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")
    return token_bytes, special


def _corpus_ids(tokenizer: Tokenizer, sentences: list[str]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    starts: list[int] = []
    for encoding in tokenizer.encode_batch(sentences, add_special_tokens=False):
        starts.append(len(ids))
        ids.extend(encoding.ids)
    return ids, starts


def _derive_tables(tokenizer_json: bytes, eos_token: str | None) -> dict[str, Any]:
    """Everything the simulator needs from a tokenizer.json, as marshal-able data (the slow part)."""
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    token_ids: dict[str, int] = {}
    for content in [*(token.content for token in _REQUIRED_TOKENS), *([eos_token] if eos_token else [])]:
        token_id = tokenizer.token_to_id(content)
        if token_id is not None:
            token_ids[content] = token_id
    token_bytes, special = _byte_tables(tokenizer, orjson.loads(tokenizer_json))
    reasoning_ids, reasoning_starts = _corpus_ids(tokenizer, corpus.reasoning_sentences(1, CORPUS_SENTENCES))
    answer_ids, answer_starts = _corpus_ids(tokenizer, corpus.answer_sentences(2, CORPUS_SENTENCES))
    return {
        "token_bytes": token_bytes,
        "special": special,
        "token_ids": token_ids,
        "tool_declare_ids": tokenizer.encode("tool_declare", add_special_tokens=False).ids,
        "reasoning": (reasoning_ids, reasoning_starts),
        "answer": (answer_ids, answer_starts),
    }


def sim_cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "datagen-operator" / "sim"


def _tables(tokenizer_json: bytes, eos_token: str | None) -> dict[str, Any]:
    """`_derive_tables`, cached on disk by (tokenizer.json, eos token, corpus code); any cache error rebuilds."""
    key = hashlib.sha256(tokenizer_json)
    key.update(f"\0{eos_token}\0{TABLES_FORMAT}\0{CORPUS_SENTENCES}\0".encode())
    key.update(resources.files(corpus.__package__).joinpath("corpus.py").read_bytes())
    path = sim_cache_root() / f"tables-{key.hexdigest()[:24]}.marshal"
    try:
        cached: dict[str, Any] = marshal.loads(path.read_bytes())
        return cached
    except (OSError, EOFError, ValueError, TypeError):
        pass
    tables = _derive_tables(tokenizer_json, eos_token)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, delete=False) as staging:
            staging.write(marshal.dumps(tables))
        os.replace(staging.name, path)
    except OSError:
        pass  # an unwritable cache only costs start-up time
    return tables


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def _chat_template(directory: Path, override: Path | None) -> str | None:
    if override is not None:
        return override.read_text(encoding="utf-8")
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(directory / "tokenizer_config.json").get("chat_template")
    return template if isinstance(template, str) else None


def _as_id_set(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {item for item in value if isinstance(item, int)}
    return set()


def load_vocab(directory: Path, chat_template_file: Path | None = None) -> SimVocab:
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise VocabError(
            f"{directory} has no tokenizer.json: the simulator needs a tokenizer directory "
            "(`datagen standin-tokenizer` builds the Kimi-K2-format stand-in)"
        )
    tokenizer_json = tokenizer_file.read_bytes()
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    eos_token = tokenizer_config.get("eos_token")
    eos_token = eos_token if isinstance(eos_token, str) else None
    tables = _tables(tokenizer_json, eos_token)
    ids: dict[str, int] = tables["token_ids"]
    missing = [token.content for token in _REQUIRED_TOKENS if token.content not in ids]
    if missing:
        raise VocabError(f"{directory}: no {missing} token(s); the simulator serves Kimi-K2-format models")
    token_bytes = tuple(tables["token_bytes"])
    text_bytes = tuple(b"" if special else raw for raw, special in zip(token_bytes, tables["special"], strict=True))
    model_config = _read_json(directory / "config.json")
    eos_ids = {ids[kimi_tokens.IM_END.content]}
    eos_ids |= _as_id_set(model_config.get("eos_token_id"))
    eos_ids |= _as_id_set(_read_json(directory / "generation_config.json").get("eos_token_id"))
    if eos_token in ids:
        eos_ids.add(ids[eos_token])

    def corpus_of(name: str) -> Corpus:
        corpus_ids, starts = tables[name]
        return Corpus(TokenSource.build(corpus_ids, token_bytes, text_bytes), starts)

    return SimVocab(
        lazy_tokenizer=_LazyTokenizer(tokenizer_json.decode("utf-8")),
        chat_template=_chat_template(directory, chat_template_file),
        token_bytes=token_bytes,
        text_bytes=text_bytes,
        size=len(token_bytes),
        think_id=ids[kimi_tokens.THINK.content],
        think_end_id=ids[kimi_tokens.THINK_END.content],
        im_end_id=ids[kimi_tokens.IM_END.content],
        eos_ids=frozenset(eos_ids),
        tool_section_begin_id=ids[kimi_tokens.TOOL_CALLS_SECTION_BEGIN.content],
        tool_section_end_id=ids[kimi_tokens.TOOL_CALLS_SECTION_END.content],
        tool_call_begin_id=ids[kimi_tokens.TOOL_CALL_BEGIN.content],
        tool_call_argument_begin_id=ids[kimi_tokens.TOOL_CALL_ARGUMENT_BEGIN.content],
        tool_call_end_id=ids[kimi_tokens.TOOL_CALL_END.content],
        tool_declare_marker=(
            ids[kimi_tokens.IM_SYSTEM.content],
            *tables["tool_declare_ids"],
            ids[kimi_tokens.IM_MIDDLE.content],
        ),
        reasoning=corpus_of("reasoning"),
        answer=corpus_of("answer"),
        model_config=model_config,
    )
