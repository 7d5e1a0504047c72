"""The simulator's view of a tokenizer directory: byte tables for fast decoding, the family's token runs, corpora.

Loaded once at start (imperative); everything after is read-only data for the pure model. A directory with a
tokenizer.json is read with the `tokenizers` library (importing transformers costs seconds); one without (the
real Kimi directory: tiktoken-backed remote code) through `transformers.AutoTokenizer(trust_remote_code=True)`.
What is derived from the tokenizer (per-id bytes, the corpora's ids, the family's structural texts as ids) is
cached in a marshal file keyed by the tokenizer files' hash, so a server starts in about a second; the tokenizer
itself loads on first use (text prompts, chat, tool calls).

The family (what the model writes, tokenizer/families.py) comes from the caller, else from the stand-in's
datagen_standin.json, else from marker tokens in the vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import orjson
from tokenizers import Tokenizer

from datagen_operator.engine.sim.tokens import TokenRun, TokenSource
from datagen_operator.tokenizer import corpus, families
from datagen_operator.tokenizer.families import ChatFormat, Family

CORPUS_SENTENCES = 2500  # about 40k tokens per corpus; outputs longer than that wrap around
TABLES_FORMAT = 3
CACHE_ENV = "DATAGEN_SIM_CACHE"
KIMI_OLD_OPEN_TAG = "◁think▷"
KIMI_OLD_CLOSE_TAG = "◁/think▷"
# Files of a model directory that decide its tokenizer (weights are never read).
_TOKENIZER_FILE_SUFFIXES = (".json", ".jinja", ".model", ".py", ".txt", ".tiktoken")
_WEIGHT_INDEX = "model.safetensors.index.json"


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
    inside_character: frozenset[int]
    """Cut positions that would split a character's UTF-8 bytes between two tokens (an emoji's, say)."""


class _Encoder(Protocol):
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...


class _TokenizersEncoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]


class _TransformersEncoder:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(self.tokenizer.encode(text, add_special_tokens=False)) for text in texts]


def _transformers_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer  # seconds to import: only for directories without tokenizer.json

    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=True, local_files_only=True)


class _LazyEncoder:
    """The tokenizer, loaded on first use (0.2 s for a 163k tokenizer.json; seconds through transformers)."""

    def __init__(self, load: Callable[[], _Encoder]) -> None:
        self._load: Callable[[], _Encoder] | None = load
        self._encoder: _Encoder | None = None
        self._lock = threading.Lock()

    def get(self) -> _Encoder:
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    assert self._load is not None
                    self._encoder = self._load()
                    self._load = None
        return self._encoder


@dataclass(frozen=True)
class FamilyRuns:
    """The family's structural texts as token runs, built once (they occur in every output)."""

    think_open: TokenRun
    think_close: TokenRun
    answer_open: TokenRun
    answer_open_first: TokenRun
    answer_stop: TokenRun
    tool_stop: TokenRun
    old_open: TokenRun
    """Kimi's old `◁think▷` as text (the kimi-tags misconfiguration)."""
    old_close: TokenRun
    prefill_tails: tuple[array[int], ...]
    off_tails: tuple[array[int], ...]
    think_end_id: int | None
    """The closing tag's id (reasoning_tokens counts the tokens before it)."""
    tool_gate: array[int]
    """Ids every prompt declaring tools holds (an empty array: always look)."""


@dataclass(frozen=True)
class SimVocab:
    lazy_encoder: _LazyEncoder
    chat_template: str | None
    token_bytes: tuple[bytes, ...]
    """Every id's bytes, special tokens as their content."""
    text_bytes: tuple[bytes, ...]
    """The same with special tokens as b"" (decoding with skip_special_tokens)."""
    size: int
    family: Family
    runs: FamilyRuns
    eos_ids: frozenset[int]
    """Ids that end generation unless ignore_eos: the family's stops, config eos_token_id(s), the tokenizer's eos."""
    reasoning: Corpus
    answer: Corpus
    model_config: dict[str, Any]
    special_tokens: dict[str, str] = field(default_factory=dict)
    """bos_token, eos_token, ... as transformers passes them to the chat template."""
    _singles: dict[int, TokenRun] = field(default_factory=dict, repr=False)

    @property
    def chat(self) -> ChatFormat:
        return self.family.chat

    def encode(self, text: str) -> list[int]:
        return self.lazy_encoder.get().encode_batch([text])[0]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        table = self.text_bytes if skip_special_tokens else self.token_bytes
        return b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace")

    def source(self, ids: Sequence[int]) -> TokenSource:
        """A token source for ids not from a corpus (tool calls, tags); small, built per use."""
        return TokenSource.build(ids, self.token_bytes, self.text_bytes)

    def single(self, token_id: int) -> TokenRun:
        """A one-token run, cached."""
        run = self._singles.get(token_id)
        if run is None:
            run = self._singles[token_id] = TokenRun.of(self.source([token_id]))
        return run

    def run(self, ids: Sequence[int]) -> TokenRun:
        return TokenRun.of(self.source(ids)) if ids else TokenRun()


def _byte_tables(
    size: int, regular: Iterable[tuple[str, int]], added: dict[int, tuple[str, bool]], decode_one: Callable[[int], str]
) -> tuple[list[bytes], list[bool]]:
    """Per id: its bytes (added tokens as their content) and whether it is special."""
    byte_decoder = _gpt2_byte_decoder()
    token_bytes: list[bytes] = [b""] * size
    special: list[bool] = [False] * size
    for token, token_id in regular:
        if token_id >= size or token_id in added:
            continue
        if token.isascii():  # byte-level tokens hold only '!'..'~' in ASCII, and those map to themselves
            token_bytes[token_id] = token.encode("ascii")
        else:
            try:
                token_bytes[token_id] = bytes(map(byte_decoder.__getitem__, token))
            except KeyError:  # not a byte-level vocabulary: ask the tokenizer (slower, load time only)
                token_bytes[token_id] = decode_one(token_id).encode("utf-8")
    for token_id, (content, is_special) in added.items():
        if token_id < size:
            token_bytes[token_id] = content.encode("utf-8")
            special[token_id] = is_special
    return token_bytes, special


def _inside_character(ids: Sequence[int], token_bytes: Sequence[bytes]) -> list[int]:
    """The positions after a token whose bytes leave a UTF-8 character unfinished."""
    inside = []
    pending = 0  # continuation bytes the current character still needs
    for position, token_id in enumerate(ids, start=1):
        for byte in token_bytes[token_id]:
            if pending and byte & 0xC0 == 0x80:
                pending -= 1
            else:
                pending = 3 if byte >= 0xF0 else 2 if byte >= 0xE0 else 1 if byte >= 0xC0 else 0
        if pending:
            inside.append(position)
    return inside


def _format_texts() -> list[str]:
    """Every structural text of every family (their ids are cached with the tables)."""
    texts = {KIMI_OLD_OPEN_TAG, KIMI_OLD_CLOSE_TAG}
    for family in families.FAMILIES.values():
        chat = family.chat
        texts |= {chat.think_open, chat.think_close, chat.answer_open, chat.answer_open_first}
        texts |= {chat.answer_stop, chat.tool_stop, chat.tool_declare_gate, *chat.prefill_tails, *chat.off_tails}
    return sorted(text for text in texts if text)


def _derived(
    size: int,
    regular: Iterable[tuple[str, int]],
    added: dict[int, tuple[str, bool]],
    decode_one: Callable[[int], str],
    encoder: _Encoder,
) -> dict[str, Any]:
    token_bytes, special = _byte_tables(size, regular, added, decode_one)
    tables: dict[str, Any] = {
        "token_bytes": token_bytes,
        "special": special,
        "added": {content: token_id for token_id, (content, _) in added.items()},
    }
    for name, sentences in (
        ("reasoning", corpus.reasoning_sentences(1, CORPUS_SENTENCES)),
        ("answer", corpus.answer_sentences(2, CORPUS_SENTENCES)),
    ):
        ids: list[int] = []
        starts: list[int] = []
        for encoded in encoder.encode_batch(sentences):
            starts.append(len(ids))
            ids.extend(encoded)
        tables[name] = (ids, starts, _inside_character(ids, token_bytes))
    texts = _format_texts()
    tables["format_ids"] = dict(zip(texts, encoder.encode_batch(texts), strict=True))
    return tables


def _tokenizer_json_tables(tokenizer_json: bytes) -> dict[str, Any]:
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    document = orjson.loads(tokenizer_json)
    added_tokens = tokenizer.get_added_tokens_decoder()
    added = {token_id: (token.content, bool(token.special)) for token_id, token in added_tokens.items()}
    model_vocab = document.get("model", {}).get("vocab")
    # BPE / WordPiece: read from the parsed file, faster than get_vocab()
    regular = model_vocab.items() if isinstance(model_vocab, dict) else tokenizer.get_vocab().items()
    return _derived(
        tokenizer.get_vocab_size(with_added_tokens=True),
        regular,
        added,
        lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False),
        _TokenizersEncoder(tokenizer),
    )


def _transformers_tables(directory: Path) -> dict[str, Any]:
    """The tables of a tokenizer only transformers can load (remote code such as tiktoken-backed Kimi)."""
    tokenizer = _transformers_tokenizer(directory)
    added = {
        int(token_id): (token.content, bool(token.special))
        for token_id, token in tokenizer.added_tokens_decoder.items()
    }
    size = len(tokenizer)
    regular = zip(tokenizer.convert_ids_to_tokens(list(range(size))), range(size), strict=True)
    return _derived(
        size,
        ((token, token_id) for token, token_id in regular if isinstance(token, str)),
        added,
        lambda token_id: tokenizer.decode([token_id], skip_special_tokens=False),
        _TransformersEncoder(tokenizer),
    )


def sim_cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "datagen-operator" / "sim"


def _tokenizer_files_hash(directory: Path) -> hashlib._Hash:
    """Hash of the files that decide a directory's tokenizer (names and contents; weights never read)."""
    digest = hashlib.sha256()
    tokenizer_json = directory / "tokenizer.json"
    files = [tokenizer_json] if tokenizer_json.is_file() else sorted(
        path for path in directory.iterdir()
        if path.is_file() and path.suffix in _TOKENIZER_FILE_SUFFIXES and path.name != _WEIGHT_INDEX
    )  # fmt: skip
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest


def _tables(directory: Path) -> dict[str, Any]:
    """The derived tables, cached on disk by (tokenizer files, corpus and family code); any cache error rebuilds."""
    key = _tokenizer_files_hash(directory)
    key.update(f"\0{TABLES_FORMAT}\0{CORPUS_SENTENCES}\0".encode())
    package = resources.files(corpus.__package__)
    key.update(package.joinpath("corpus.py").read_bytes() + package.joinpath("families.py").read_bytes())
    path = sim_cache_root() / f"tables-{key.hexdigest()[:24]}.marshal"
    try:
        cached: dict[str, Any] = marshal.loads(path.read_bytes())
        return cached
    except (OSError, EOFError, ValueError, TypeError):
        pass
    tokenizer_json = directory / "tokenizer.json"
    tables = (
        _tokenizer_json_tables(tokenizer_json.read_bytes())
        if tokenizer_json.is_file()
        else _transformers_tables(directory)
    )
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


def _special_tokens(directory: Path) -> dict[str, str]:
    """The named special tokens of tokenizer_config.json (strings or AddedToken dicts), by name."""
    config = _read_json(directory / "tokenizer_config.json")
    named = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            named[name] = value
    return named


def _as_id_set(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {item for item in value if isinstance(item, int)}
    return set()


def _family(directory: Path, name: str | None, added: dict[str, int]) -> Family:
    """The family asked for, else the stand-in's own, else the one whose marker tokens the vocabulary holds."""
    name = name or _read_json(directory / "datagen_standin.json").get("family")
    family = families.get_family(name) if isinstance(name, str) else families.detect_family(added)
    if family is None:
        raise VocabError(
            f"{directory}: cannot tell the model family from its vocabulary; name it with --sim-family "
            f"(known: {', '.join(families.FAMILIES)})"
        )
    missing = [marker for marker in family.chat.vocabulary_markers if marker not in added]
    if missing:
        raise VocabError(f"{directory}: no {missing} token(s), so it cannot serve the {family.name} format")
    return family


def _family_runs(
    family: Family,
    format_ids: dict[str, list[int]],
    added_ids: set[int],
    token_bytes: Sequence[bytes],
    text_bytes: Sequence[bytes],
) -> FamilyRuns:
    def run(text: str) -> TokenRun:
        return TokenRun.of(TokenSource.build(format_ids[text], token_bytes, text_bytes)) if text else TokenRun()

    chat = family.chat
    close_tags = [token_id for token_id in format_ids.get(chat.think_close, []) if token_id in added_ids]
    return FamilyRuns(
        think_open=run(chat.think_open),
        think_close=run(chat.think_close),
        answer_open=run(chat.answer_open),
        answer_open_first=run(chat.answer_open_first),
        answer_stop=run(chat.answer_stop),
        tool_stop=run(chat.tool_stop),
        old_open=run(KIMI_OLD_OPEN_TAG),
        old_close=run(KIMI_OLD_CLOSE_TAG),
        prefill_tails=tuple(array("I", format_ids[tail]) for tail in chat.prefill_tails),
        off_tails=tuple(array("I", format_ids[tail]) for tail in chat.off_tails),
        think_end_id=close_tags[0] if close_tags else None,
        tool_gate=array("I", format_ids[chat.tool_declare_gate] if chat.tool_declare_gate else []),
    )


def load_vocab(
    directory: Path, chat_template_file: Path | None = None, family: str | None = None, model_dir: Path | None = None
) -> SimVocab:
    """The simulator's vocabulary for a tokenizer directory (tokenizer.json, or what transformers loads). The
    model's configs (its eos ids, what resolution reads) come from `model_dir` when given, as SGLang reads them
    from --model-path while the tokenizer comes from --tokenizer-path."""
    tokenizer_json = directory / "tokenizer.json"
    if not tokenizer_json.is_file() and not (directory / "tokenizer_config.json").is_file():
        raise VocabError(
            f"{directory} has neither tokenizer.json nor tokenizer_config.json: the simulator needs a tokenizer "
            "directory (`datagen standin-tokenizer --preset NAME` builds a stand-in)"
        )
    tables = _tables(directory)
    added: dict[str, int] = tables["added"]
    model_family = _family(directory, family, added)
    token_bytes = tuple(tables["token_bytes"])
    text_bytes = tuple(b"" if special else raw for raw, special in zip(token_bytes, tables["special"], strict=True))
    configs = model_dir if model_dir is not None else directory
    model_config = _read_json(configs / "config.json")
    format_ids: dict[str, list[int]] = tables["format_ids"]
    eos_ids = {token_id for text in (model_family.chat.answer_stop, model_family.chat.tool_stop) if text
               for token_id in format_ids[text][-1:]}  # fmt: skip
    eos_ids |= _as_id_set(model_config.get("eos_token_id"))
    eos_ids |= _as_id_set(_read_json(configs / "generation_config.json").get("eos_token_id"))
    special_tokens = _special_tokens(directory)
    if special_tokens.get("eos_token") in added:
        eos_ids.add(added[special_tokens["eos_token"]])

    def corpus_of(name: str) -> Corpus:
        corpus_ids, starts, inside = tables[name]
        return Corpus(TokenSource.build(corpus_ids, token_bytes, text_bytes), starts, frozenset(inside))

    def load_encoder() -> _Encoder:
        if tokenizer_json.is_file():
            return _TokenizersEncoder(Tokenizer.from_file(str(tokenizer_json)))
        return _TransformersEncoder(_transformers_tokenizer(directory))

    return SimVocab(
        lazy_encoder=_LazyEncoder(load_encoder),
        chat_template=_chat_template(directory, chat_template_file),
        token_bytes=token_bytes,
        text_bytes=text_bytes,
        size=len(token_bytes),
        family=model_family,
        runs=_family_runs(model_family, format_ids, set(added.values()), token_bytes, text_bytes),
        eos_ids=frozenset(eos_ids),
        reasoning=corpus_of("reasoning"),
        answer=corpus_of("answer"),
        model_config=model_config,
        special_tokens=special_tokens,
    )
