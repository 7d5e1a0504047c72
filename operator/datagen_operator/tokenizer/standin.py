"""The Kimi-K2-format stand-in tokenizer: built deterministically from code in this package, then cached.

The real Kimi vocabulary (tiktoken.model) cannot be fetched here, so tests and the simulator use a
stand-in that keeps everything the data checks depend on (shared/reference/kimi-k2-format.md):
163,840 ids; every special and structural token at its real id with its real `special` flag; the other
ids of 163584..163839 as reserved special tokens; byte-level BPE below 163584 (so any UTF-8 text
round-trips); and a chat template rendering the Kimi-K2 format. The directory loads with
`transformers.AutoTokenizer.from_pretrained(path)` offline, without `trust_remote_code`.

The BPE merges are trained with the `tokenizers` trainer on synthetic text from `corpus.py` (the trainer
is deterministic for a given input); unused regular ids are filled with unreachable filler tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Final

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from datagen_operator.tokenizer import kimi_tokens
from datagen_operator.tokenizer.chat_template import TEMPLATE_RESOURCE, kimi_k2_chat_template
from datagen_operator.tokenizer.corpus import training_lines

STANDIN_NAME: Final = "kimi-k2-standin"
STANDIN_VERSION: Final = 1
CACHE_ENV: Final = "DATAGEN_TOKENIZER_CACHE"
MODEL_MAX_LENGTH: Final = 262_144
TRAINED_VOCAB_TARGET: Final = 12_000  # merges learnt from the synthetic corpus (it saturates near 6k)
TRAINING_LINES: Final = 12_000
# Files whose content decides the built directory; their hash keys the cache folder.
_SOURCE_FILES: Final = ("standin.py", "corpus.py", "kimi_tokens.py", TEMPLATE_RESOURCE)
FILES: Final = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "config.json", "generation_config.json", "datagen_standin.json",
)  # fmt: skip


def source_hash() -> str:
    """Hash of the builder's sources and the `tokenizers` version: a change builds a new cache folder."""
    digest = hashlib.sha256(f"v{STANDIN_VERSION} tokenizers={tokenizers.__version__}".encode())
    package = resources.files(__package__)
    for name in _SOURCE_FILES:
        digest.update(name.encode() + b"\0" + package.joinpath(name).read_bytes())
    return digest.hexdigest()[:12]


def default_cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "datagen-operator" / "tokenizer"


def _train_byte_level_bpe() -> dict[str, Any]:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB_TARGET,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    bpe.train_from_iterator(training_lines(count=TRAINING_LINES), trainer=trainer)
    result: dict[str, Any] = json.loads(bpe.to_str())
    return result


def tokenizer_json() -> dict[str, Any]:
    """The full tokenizer.json document (pure function of this package's sources)."""
    document = _train_byte_level_bpe()
    vocab: dict[str, int] = document["model"]["vocab"]
    # Unreachable filler tokens (no merge produces them) occupy the rest of the regular range.
    filler_ids = range(len(vocab), kimi_tokens.FIRST_SPECIAL_ID)
    vocab.update({f"filler{token_id}": token_id for token_id in filler_ids})
    assert len(vocab) == kimi_tokens.FIRST_SPECIAL_ID == max(vocab.values()) + 1
    document["added_tokens"] = [
        {
            "id": token.id,
            "content": token.content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token.special,
        }
        for token in kimi_tokens.added_tokens()
    ]
    document["model"]["unk_token"] = None
    return document


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": kimi_tokens.BOS.content,
        "eos_token": kimi_tokens.EOS.content,
        "unk_token": kimi_tokens.UNK.content,
        "pad_token": kimi_tokens.PAD.content,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,  # keeps decode a plain concatenation of token bytes
        "add_bos_token": False,
        "add_eos_token": False,
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
    }


def model_config() -> dict[str, Any]:
    """A config.json describing the stand-in (no weights): ids the server and clients read from it."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": kimi_tokens.VOCAB_SIZE,
        "bos_token_id": kimi_tokens.BOS.id,
        "eos_token_id": kimi_tokens.IM_END.id,
        "pad_token_id": kimi_tokens.PAD.id,
        "max_position_embeddings": MODEL_MAX_LENGTH,
    }


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False) + "\n").encode("utf-8")


def standin_files() -> dict[str, bytes]:
    """Every file of the stand-in directory, by name."""
    tokenizer = tokenizer_json()
    # Round-trip through the library so a malformed document fails here, not in a consumer.
    Tokenizer.from_str(json.dumps(tokenizer))
    return {
        "tokenizer.json": json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        "tokenizer_config.json": _json_bytes(tokenizer_config()),
        "special_tokens_map.json": _json_bytes(
            {
                "bos_token": kimi_tokens.BOS.content,
                "eos_token": kimi_tokens.EOS.content,
                "unk_token": kimi_tokens.UNK.content,
                "pad_token": kimi_tokens.PAD.content,
            }
        ),
        "chat_template.jinja": kimi_k2_chat_template().encode("utf-8"),
        "config.json": _json_bytes(model_config()),
        "generation_config.json": _json_bytes(
            {"bos_token_id": kimi_tokens.BOS.id, "eos_token_id": kimi_tokens.IM_END.id}
        ),
        "datagen_standin.json": _json_bytes(
            {
                "name": STANDIN_NAME,
                "version": STANDIN_VERSION,
                "source_hash": source_hash(),
                "note": "Stand-in for the Kimi-K2 tokenizer: real special ids and chat format, synthetic BPE.",
            }
        ),
    }


def build_standin_tokenizer(out_dir: Path) -> Path:
    """Write the stand-in directory to `out_dir` (created; existing files of the same names replaced)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in standin_files().items():
        (out_dir / name).write_bytes(content)
    return out_dir


def standin_dir_name() -> str:
    return f"{STANDIN_NAME}-v{STANDIN_VERSION}-{source_hash()}"


def ensure_standin_tokenizer(cache_dir: Path | None = None) -> Path:
    """The cached stand-in directory, built on first use. Safe when several processes race to build it.

    `cache_dir` is the cache root (default: $DATAGEN_TOKENIZER_CACHE, else
    ~/.cache/datagen-operator/tokenizer); the directory inside is keyed by version and source hash.
    """
    root = cache_dir if cache_dir is not None else default_cache_root()
    final = root / standin_dir_name()
    if all((final / name).is_file() for name in FILES):
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        build_standin_tokenizer(staging)
        try:
            staging.rename(final)  # atomic: readers see a complete directory or none
        except OSError:
            if not all((final / name).is_file() for name in FILES):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen standin-tokenizer",
        description="Build (or find in the cache) the Kimi-K2-format stand-in tokenizer; print its directory.",
    )
    parser.add_argument("--out", type=Path, help="write the directory here instead of the cache")
    parser.add_argument("--cache-dir", type=Path, help=f"cache root (default ${CACHE_ENV} or ~/.cache/...)")
    args = parser.parse_args(argv)
    path = build_standin_tokenizer(args.out) if args.out else ensure_standin_tokenizer(args.cache_dir)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
