"""Tokenizer class of the Kimi-K2.5 tiktoken stand-in, copied into the stand-in directory as `tokenization_kimi.py`.

Written for datagen-operator (not Moonshot's code), with the public shape of the real Kimi-K2 remote code:
a `transformers` slow tokenizer (`PreTrainedTokenizer`) named `TikTokenTokenizer`, loaded through
`trust_remote_code` from `tokenizer_config.json`'s `auto_map`, backed by `tiktoken` over `tiktoken.model`
(one `base64(token bytes) rank` per line; the rank is the id). The 256 ids after the ranks are the special
range, named by `added_tokens_decoder` (`<|reserved_token_{id}|>` when unnamed).

Differences from the real class, each on purpose:
- `pat_str` is the byte-level split the stand-in's BPE was trained with (GPT-2's), not Kimi's Han-aware
  split, so this class gives the same ids as the tokenizer.json stand-in.
- `skip_special_tokens` drops exactly the ids whose `added_tokens_decoder` entry is `special` (the
  reference table), and decode is the plain concatenation of token bytes (no spaces around added tokens).
- `tiktoken.model` is read directly: tiktoken's loader caches files in /tmp by path, not by content, so a
  rebuilt file at the same path would be read stale.

This file runs inside `transformers`' dynamic-module loader: it imports only the standard library,
`tiktoken` and `transformers` (what the worker image holds), never datagen_operator.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any, cast

import tiktoken
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}


def load_ranks(path: str) -> dict[bytes, int]:
    """`tiktoken.model`: `base64(token bytes) rank` per line (tiktoken's BPE file format)."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _added_content(token: Any) -> str:
    """The content of an `added_tokens_decoder` value (an AddedToken, a dict from JSON, or a string)."""
    if isinstance(token, dict):
        return str(token["content"])
    return str(getattr(token, "content", token))


def _added_special(token: Any) -> bool:
    if isinstance(token, dict):
        return bool(token.get("special", False))
    return bool(getattr(token, "special", False))


class TikTokenTokenizer(PreTrainedTokenizer):
    """Kimi-K2-format tokenizer over tiktoken: ids below the special range are tiktoken ranks."""

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012 (transformers reads a class list)
    num_reserved_special_tokens = 256
    pat_str = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(
        self,
        vocab_file: str,
        bos_token: Any = "[BOS]",
        eos_token: Any = "[EOS]",
        unk_token: Any = "[UNK]",
        pad_token: Any = "[PAD]",
        additional_special_tokens: list[str] | None = None,
        added_tokens_decoder: dict[int, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not os.path.isfile(vocab_file):
            raise ValueError(f"tiktoken vocabulary file not found: {vocab_file}")
        self.vocab_file = vocab_file
        ranks = load_ranks(vocab_file)
        first_special = len(ranks)
        if sorted(ranks.values()) != list(range(first_special)):
            raise ValueError(f"{vocab_file}: ranks must be exactly 0..{first_special - 1}")
        named = {int(index): token for index, token in (added_tokens_decoder or {}).items()}
        special_ids = range(first_special, first_special + self.num_reserved_special_tokens)
        self.special_tokens = {
            _added_content(named[index]) if index in named else f"<|reserved_token_{index}|>": index
            for index in special_ids
        }
        self.model = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=self.pat_str,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.n_words: int = self.model.n_vocab
        # Ids that skip_special_tokens drops: the `special` flag of each added token, unnamed ones included.
        self._skipped_ids = frozenset(
            index for index in special_ids if index not in named or _added_special(named[index])
        )
        # Token strings in the byte-level alphabet (what transformers and the tokenizer.json stand-in show).
        self.byte_encoder: dict[int, str] = bytes_to_unicode()  # type: ignore[no-untyped-call]  # transformers
        self.byte_decoder = {char: byte for byte, char in self.byte_encoder.items()}
        self._id_bytes: list[bytes] = [b""] * self.n_words
        for token, rank in ranks.items():
            self._id_bytes[rank] = token
        for content, index in self.special_tokens.items():
            self._id_bytes[index] = content.encode("utf-8")
        self.decoder: dict[int, str] = {
            index: "".join(self.byte_encoder[byte] for byte in token) for index, token in enumerate(self._id_bytes)
        }
        self.encoder: dict[str, int] = {token: index for index, token in self.decoder.items()}
        if additional_special_tokens is not None:  # transformers 5 saves it as extra_special_tokens
            kwargs["additional_special_tokens"] = additional_special_tokens
        super().__init__(  # type: ignore[no-untyped-call]  # transformers' base class has no type hints
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=named,
            **kwargs,
        )

    # --- encoding ---------------------------------------------------------------------------------

    def encode(self, text: Any, allow_special_tokens: bool = True, **kwargs: Any) -> Any:
        """Text to ids with tiktoken; added tokens written in the text become their ids unless
        `allow_special_tokens` is false. Other arguments (pairs, padding, tensors) go to transformers."""
        if kwargs or not isinstance(text, str):
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        # transformers has already split off the added tokens; any left here are plain text.
        return [self.decoder[index] for index in self.model.encode(text, disallowed_special=())]

    def _convert_token_to_id(self, token: str) -> int:
        index: int = self.encoder.get(token, self.unk_token_id)
        return index

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder[index]

    # --- decoding ---------------------------------------------------------------------------------

    def _decode(
        self,
        token_ids: int | Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else [int(index) for index in token_ids]
        if skip_special_tokens:
            ids = [index for index in ids if index not in self._skipped_ids]
        return b"".join(self._id_bytes[index] for index in ids).decode("utf-8", errors="replace")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(self.byte_decoder[char] for char in "".join(tokens)).decode("utf-8", errors="replace")

    @staticmethod
    def clean_up_tokenization(out_string: str) -> str:
        return out_string

    # --- vocabulary -------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        if not os.path.isdir(save_directory):
            raise ValueError(f"vocabulary path ({save_directory}) should be a directory")
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        out_file = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["vocab_file"])
        if os.path.abspath(self.vocab_file) != os.path.abspath(out_file):
            shutil.copyfile(self.vocab_file, out_file)
        return (out_file,)

    # --- chat ---------------------------------------------------------------------------------------

    def apply_chat_template(  # type: ignore[override]
        self,
        conversation: Any,
        tools: list[dict[str, Any]] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        thinking: bool = True,
        **kwargs: Any,
    ) -> Any:
        """The real class's defaults: text unless `tokenize=True`, a generation prompt, thinking on."""
        return super().apply_chat_template(
            conversation,
            tools=cast("list[dict[Any, Any] | Callable[..., Any]] | None", tools),
            tokenize=tokenize,
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
            **kwargs,
        )
