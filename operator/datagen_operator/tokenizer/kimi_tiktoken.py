"""The Kimi-K2.5 stand-in shaped like the real model directory: tiktoken.model + remote-code tokenizer class.

The real Kimi-K2.5 directory has no tokenizer.json: its tokenizer is `tokenization_kimi.py` (a
`transformers` slow tokenizer over tiktoken), loaded with `trust_remote_code` through `tokenizer_config.json`'s
`auto_map`. This stand-in makes the worker, canary and verify take that loading path offline.

The vocabulary is derived from the tokenizer.json stand-in (standin.py): every id below 163584 keeps its
bytes, and a BPE rank is the id, so both stand-ins give the same ids and records made with either decode the
same (tests/unit/tokenizer/test_kimi_tiktoken_standin.py compares them). The tokenizer class is
`kimi_tiktoken_tokenization.py` of this package, copied as `tokenization_kimi.py`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Final

import tiktoken

from datagen_operator.tokenizer import kimi_tokens, standin
from datagen_operator.tokenizer.chat_template import TEMPLATE_RESOURCE
from datagen_operator.tokenizer.families import get_family

STANDIN_NAME: Final = "kimi-k2.5-tiktoken-standin"
FAMILY: Final = "kimi-k2"  # the tokenizer.json stand-in family whose vocabulary, template and configs it keeps
STANDIN_VERSION: Final = 1
TOKENIZATION_RESOURCE: Final = "kimi_tiktoken_tokenization.py"
TOKENIZATION_FILE: Final = "tokenization_kimi.py"  # the real model directory's name for its tokenizer module
TOKENIZER_CLASS: Final = "TikTokenTokenizer"
_SOURCE_FILES: Final = ("kimi_tiktoken.py", TOKENIZATION_RESOURCE, "kimi_tokens.py", TEMPLATE_RESOURCE)
# A real Kimi-K2.5 directory's tokenizer files (no tokenizer.json, no special_tokens_map.json).
TOKENIZER_FILES: Final = (
    "chat_template.jinja", "tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json",
)  # fmt: skip
FILES: Final = (*TOKENIZER_FILES, "config.json", "generation_config.json", "datagen_standin.json")
# `additional_special_tokens` of the real tokenizer_config.json, less the two header tokens our
# kimi_tokens does not name (they stay reserved ids, as in the tokenizer.json stand-in).
_ADDITIONAL_SPECIAL: Final = (
    kimi_tokens.IM_END, kimi_tokens.IM_USER, kimi_tokens.IM_ASSISTANT, kimi_tokens.EOT,
    kimi_tokens.IM_SYSTEM, kimi_tokens.IM_MIDDLE,
)  # fmt: skip


def source_hash() -> str:
    """Hash of this builder, the tokenizer class, the template, tiktoken's version and the tokenizer.json
    stand-in's own hash (the vocabulary comes from it): a change builds a new cache folder."""
    return standin.sources_hash(
        f"v{STANDIN_VERSION} tiktoken={tiktoken.__version__} {standin.source_hash()}", _SOURCE_FILES
    )


def standin_dir_name() -> str:
    return f"{STANDIN_NAME}-v{STANDIN_VERSION}-{source_hash()}"


def tokenization_source() -> bytes:
    return resources.files(__package__).joinpath(TOKENIZATION_RESOURCE).read_bytes()


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (transformers' `bytes_to_unicode`, without importing it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in alphabet)
    alphabet.update({byte: chr(256 + offset) for offset, byte in enumerate(shifted)})
    return alphabet


def mergeable_ranks(tokenizer_document: dict[str, Any]) -> dict[bytes, int]:
    """{token bytes: id} for ids 0..163583 of a byte-level BPE tokenizer.json document.

    Byte-level vocab strings spell bytes in GPT-2's printable alphabet; the filler ids (no trained
    token) are plain-ASCII strings no merge produces, so they stay unreachable under tiktoken too.
    """
    byte_of = {char: byte for byte, char in byte_level_alphabet().items()}
    vocab: dict[str, int] = tokenizer_document["model"]["vocab"]
    ranks = {bytes(byte_of[char] for char in token): token_id for token, token_id in vocab.items()}
    if sorted(ranks.values()) != list(range(kimi_tokens.FIRST_SPECIAL_ID)):
        raise ValueError("the stand-in vocabulary must hold each id below the special range exactly once")
    return ranks


def tiktoken_model(ranks: dict[bytes, int]) -> bytes:
    """tiktoken's BPE file: `base64(token bytes) rank` per line, by rank."""
    lines = (base64.b64encode(token) + b" " + str(rank).encode() for token, rank in sorted(ranks.items(), key=_rank))
    return b"\n".join(lines) + b"\n"


def _rank(item: tuple[bytes, int]) -> int:
    return item[1]


def tokenizer_config() -> dict[str, Any]:
    return {
        "added_tokens_decoder": {
            str(token.id): {
                "content": token.content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": token.special,
            }
            for token in kimi_tokens.added_tokens()
        },
        "additional_special_tokens": [token.content for token in _ADDITIONAL_SPECIAL],
        "auto_map": {"AutoTokenizer": [f"{TOKENIZATION_FILE.removesuffix('.py')}.{TOKENIZER_CLASS}", None]},
        "bos_token": kimi_tokens.BOS.content,
        "clean_up_tokenization_spaces": False,
        "eos_token": kimi_tokens.EOS.content,
        "model_max_length": standin.MODEL_MAX_LENGTH,
        "pad_token": kimi_tokens.PAD.content,
        "tokenizer_class": TOKENIZER_CLASS,
        "unk_token": kimi_tokens.UNK.content,
    }


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def standin_files() -> dict[str, bytes]:
    """Every file of the directory, by name."""
    family = get_family(FAMILY)
    ranks = mergeable_ranks(standin.tokenizer_json(family))
    return {
        "chat_template.jinja": standin.chat_template(family).encode("utf-8"),
        "tiktoken.model": tiktoken_model(ranks),
        TOKENIZATION_FILE: tokenization_source(),
        "tokenizer_config.json": _json_bytes(tokenizer_config()),
        "config.json": _json_bytes(standin.model_config(family)),
        "generation_config.json": _json_bytes(dict(family.generation_config)),
        "datagen_standin.json": _json_bytes(
            {
                "name": STANDIN_NAME,
                "family": FAMILY,
                "version": STANDIN_VERSION,
                "source_hash": source_hash(),
                "note": "Stand-in for the Kimi-K2.5 tokenizer directory: tiktoken.model + remote code, synthetic BPE.",
            }
        ),
    }


def build_kimi_tiktoken_standin(out_dir: Path) -> Path:
    """Write the directory to `out_dir` (created; files of the same names replaced)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in standin_files().items():
        (out_dir / name).write_bytes(content)
    return out_dir


def ensure_kimi_tiktoken_standin(cache_dir: Path | None = None) -> Path:
    """The cached directory, built on first use; safe when several processes race to build it."""
    root = cache_dir if cache_dir is not None else standin.default_cache_root()
    return standin.build_cached(root / standin_dir_name(), FILES, build_kimi_tiktoken_standin)


def build_preset_standin(preset_name: str, model_dir: Path) -> Path:
    """The stand-in tokenizer directory of a preset, in the layout its real model directory has (what
    `datagen run --standin` and `datagen preflight --standin` build where model.path does not exist)."""
    from datagen_operator.presets import get_preset

    if get_preset(preset_name).standin_layout == "kimi-tiktoken":
        return build_kimi_tiktoken_standin(model_dir)
    return standin.ensure_standin(preset_name, model_dir)


def standin_tokenizer_main(argv: list[str]) -> int:
    """`datagen standin-tokenizer`: `--kimi-tiktoken` builds this directory, anything else standin.py's."""
    if "--kimi-tiktoken" in argv:
        return main([arg for arg in argv if arg != "--kimi-tiktoken"])
    if {"-h", "--help"} & set(argv):  # standin.py's parser does not know the flag
        print(
            "--kimi-tiktoken: build the Kimi-K2.5 layout instead (tiktoken.model + tokenization_kimi.py, no\n"
            "tokenizer.json; loads with trust_remote_code). `--kimi-tiktoken --help` for its options.\n"
        )
    return standin.main(argv)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen standin-tokenizer --kimi-tiktoken",
        description="Build (or find in the cache) the Kimi-K2.5 stand-in shaped like the real model directory "
        "(tiktoken.model + tokenization_kimi.py, loaded with trust_remote_code); print its directory.",
    )
    parser.add_argument("--out", type=Path, help="write the directory here instead of the cache")
    parser.add_argument("--cache-dir", type=Path, help=f"cache root (default ${standin.CACHE_ENV} or ~/.cache/...)")
    args = parser.parse_args(argv)
    path = build_kimi_tiktoken_standin(args.out) if args.out else ensure_kimi_tiktoken_standin(args.cache_dir)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
