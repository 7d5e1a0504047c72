"""Stand-in tokenizers, one per model family: built deterministically from code in this package, then cached.

The real vocabularies cannot be fetched here, so tests and the simulator use stand-ins that keep everything
the data checks depend on, as described by the family (families.py): the tokenizer's size; every special
and structural token at its real id with its real `special` flag; the other ids of the added ranges as
reserved tokens; byte-level BPE on the remaining ids (so any UTF-8 text round-trips); a chat template
rendering the family's format; config.json and generation_config.json with the family's stop ids. The
directory loads with `transformers.AutoTokenizer.from_pretrained(path)` offline, without `trust_remote_code`,
and names its family in datagen_standin.json (the simulator reads it).

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
from collections.abc import Callable, Iterable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from datagen_operator.tokenizer.corpus import training_lines
from datagen_operator.tokenizer.families import FAMILIES, Family, get_family

DEFAULT_FAMILY: Final = "kimi-k2"
STANDIN_SUFFIX: Final = "-standin"
STANDIN_NAME: Final = DEFAULT_FAMILY + STANDIN_SUFFIX
STANDIN_VERSION: Final = 1
METADATA_FILE: Final = "datagen_standin.json"
CACHE_ENV: Final = "DATAGEN_TOKENIZER_CACHE"
MODEL_MAX_LENGTH: Final = FAMILIES[DEFAULT_FAMILY].model_max_length
TRAINED_VOCAB_TARGET: Final = 12_000  # merges learnt from the synthetic corpus (it saturates near 6k)
TRAINING_LINES: Final = 12_000
# Files whose content decides the built directory; their hash keys the cache folder.
_SOURCE_FILES: Final = (
    "standin.py", "corpus.py", "kimi_tokens.py", "families.py", *sorted({f.template for f in FAMILIES.values()}),
)  # fmt: skip
FILES: Final = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "config.json", "generation_config.json", METADATA_FILE,
)  # fmt: skip


def source_hash() -> str:
    """Hash of the builder's sources and the `tokenizers` version: a change builds a new cache folder."""
    return sources_hash(f"v{STANDIN_VERSION} tokenizers={tokenizers.__version__}", _SOURCE_FILES)


def sources_hash(prefix: str, names: Iterable[str]) -> str:
    """sha256 of `prefix` and this package's files `names`: the key of a cached build."""
    digest = hashlib.sha256(prefix.encode())
    package = resources.files(__package__)
    for name in names:
        digest.update(name.encode() + b"\0" + package.joinpath(name).read_bytes())
    return digest.hexdigest()[:12]


def default_cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "datagen-operator" / "tokenizer"


@cache
def _trained_byte_level_bpe() -> str:
    """The trained BPE document (shared by every family: only the ids it lands on differ)."""
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
    return bpe.to_str()


def tokenizer_json(family: Family = FAMILIES[DEFAULT_FAMILY]) -> dict[str, Any]:
    """The full tokenizer.json document (pure function of this package's sources)."""
    document: dict[str, Any] = json.loads(_trained_byte_level_bpe())
    added = family.added_tokens()
    added_ids = {token.id for token in added}
    # The learnt tokens keep their order on the ids the added tokens leave free; unreachable filler tokens
    # (no merge produces them) occupy the rest.
    free_ids = [token_id for token_id in range(family.tokenizer_size) if token_id not in added_ids]
    learnt = sorted(document["model"]["vocab"].items(), key=lambda item: item[1])
    vocab = {token: free_ids[index] for index, (token, _) in enumerate(learnt)}
    vocab.update({f"filler{token_id}": token_id for token_id in free_ids[len(learnt) :]})
    assert len(vocab) + len(added) == family.tokenizer_size
    # Added tokens among the regular ids (DeepSeek's 0..2) must be in the model's vocabulary too, as in the
    # real files: `tokenizers` gives an added token that is not an id past the model's vocabulary.
    vocab.update({token.content: token.id for token in added if token.id < free_ids[-1]})
    document["model"]["vocab"] = vocab
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
        for token in added
    ]
    document["model"]["unk_token"] = None
    return document


def _named_tokens(family: Family) -> dict[str, str]:
    named = {"bos_token": family.bos, "eos_token": family.eos, "unk_token": family.unk, "pad_token": family.pad}
    return {key: content for key, content in named.items() if content is not None}


def tokenizer_config(family: Family = FAMILIES[DEFAULT_FAMILY]) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **_named_tokens(family),
        "model_max_length": family.model_max_length,
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
            for token in family.added_tokens()
        },
    }


def model_config(family: Family = FAMILIES[DEFAULT_FAMILY]) -> dict[str, Any]:
    """A config.json describing the stand-in (no weights): ids the server and clients read from it."""
    return dict(family.model_config)


def chat_template(family: Family) -> str:
    """The family's chat template: its resource with the family's edits applied."""
    text = resources.files(__package__).joinpath(family.template).read_text(encoding="utf-8")
    for old, new in family.template_edits:
        if text.count(old) != 1:
            raise ValueError(f"{family.template}: the text {family.name} replaces is not there exactly once")
        text = text.replace(old, new)
    return text


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False) + "\n").encode("utf-8")


def standin_files(family: Family = FAMILIES[DEFAULT_FAMILY]) -> dict[str, bytes]:
    """Every file of the stand-in directory, by name."""
    tokenizer = tokenizer_json(family)
    # Round-trip through the library so a malformed document fails here, not in a consumer.
    Tokenizer.from_str(json.dumps(tokenizer))
    return {
        "tokenizer.json": json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        "tokenizer_config.json": _json_bytes(tokenizer_config(family)),
        "special_tokens_map.json": _json_bytes(_named_tokens(family)),
        "chat_template.jinja": chat_template(family).encode("utf-8"),
        "config.json": _json_bytes(model_config(family)),
        "generation_config.json": _json_bytes(dict(family.generation_config)),
        METADATA_FILE: _json_bytes(
            {
                "name": family.name + STANDIN_SUFFIX,
                "family": family.name,
                "version": STANDIN_VERSION,
                "source_hash": source_hash(),
                "note": f"Stand-in for the {family.description} tokenizer: real special ids and chat format, "
                "synthetic BPE.",
            }
        ),
    }


def build_standin_tokenizer(out_dir: Path, family: str = DEFAULT_FAMILY) -> Path:
    """Write the stand-in directory to `out_dir` (created; existing files of the same names replaced)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, content in standin_files(get_family(family)).items():
        (out_dir / name).write_bytes(content)
    return out_dir


def standin_dir_name(family: str = DEFAULT_FAMILY) -> str:
    return f"{get_family(family).name}{STANDIN_SUFFIX}-v{STANDIN_VERSION}-{source_hash()}"


def standin_family(directory: Path) -> str | None:
    """The family a stand-in directory was built for (None for any other directory)."""
    try:
        family = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8")).get("family")
    except (OSError, ValueError, AttributeError):
        return None
    return family if isinstance(family, str) else None


def _is_current(directory: Path, family: str) -> bool:
    if not all((directory / name).is_file() for name in FILES) or standin_family(directory) != family:
        return False
    metadata = json.loads((directory / METADATA_FILE).read_text(encoding="utf-8"))
    return bool(metadata.get("source_hash") == source_hash())


def ensure_standin(preset_name: str, out_dir: Path | None = None) -> Path:
    """The stand-in tokenizer directory preset `preset_name` needs: cached (built on first use), or written
    to `out_dir` unless it already holds the current build."""
    from datagen_operator.presets import get_preset  # presets import pydantic; the builder alone does not

    family = get_preset(preset_name).family
    if out_dir is None:
        return ensure_standin_tokenizer(family=family)
    return out_dir if _is_current(out_dir, family) else build_standin_tokenizer(out_dir, family)


def ensure_standin_tokenizer(cache_dir: Path | None = None, family: str = DEFAULT_FAMILY) -> Path:
    """The cached stand-in directory of `family`, built on first use. Safe when several processes race to build it.

    `cache_dir` is the cache root (default: $DATAGEN_TOKENIZER_CACHE, else
    ~/.cache/datagen-operator/tokenizer); the directory inside is keyed by family, version and source hash.
    """
    root = cache_dir if cache_dir is not None else default_cache_root()
    return build_cached(
        root / standin_dir_name(family), FILES, lambda staging: build_standin_tokenizer(staging, family)
    )


def build_cached(final: Path, files: Iterable[str], build: Callable[[Path], Path]) -> Path:
    """`final` once it holds every one of `files`, else built there by `build(staging)`; safe when several
    processes race to build it (each builds aside, one rename wins)."""
    files = tuple(files)
    if all((final / name).is_file() for name in files):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(staging)
        try:
            staging.rename(final)  # atomic: readers see a complete directory or none
        except OSError:
            if not all((final / name).is_file() for name in files):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen standin-tokenizer",
        description="Build (or find in the cache) the stand-in tokenizer of a preset's model family (default: the "
        "Kimi-K2-format one); print its directory.",
    )
    parser.add_argument("--preset", help="the preset whose model family to build (default: kimi-k2.5)")
    parser.add_argument("--out", type=Path, help="write the directory here instead of the cache")
    parser.add_argument("--cache-dir", type=Path, help=f"cache root (default ${CACHE_ENV} or ~/.cache/...)")
    args = parser.parse_args(argv)
    family = DEFAULT_FAMILY
    if args.preset is not None:
        from datagen_operator.presets import get_preset

        try:
            family = get_preset(args.preset).family
        except KeyError as error:
            parser.error(str(error.args[0]))
    path = build_standin_tokenizer(args.out, family) if args.out else ensure_standin_tokenizer(args.cache_dir, family)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
