"""The data fingerprint: what must not change between the records of one output directory.

Chat-template drift between generation and training silently corrupts drafter data (field notes 5), so
every output records the sha256 of the tokenizer files and of the chat template, the server's version
and data-affecting args (from its own /server_info), the sampling params, preset and thinking switch.
A worker refuses to resume into an output whose fingerprint differs, and says what changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path
from typing import Any

import orjson

# Files that decide how text becomes ids (never weights: a model dir holds hundreds of GB of them).
TOKENIZER_FILE_PATTERNS: tuple[str, ...] = (
    "tokenizer*", "*.tiktoken", "tiktoken.model", "*.model", "vocab.*", "merges.txt", "added_tokens.json",
    "special_tokens_map.json", "chat_template*", "tokenization_*.py",
)  # fmt: skip
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")

# /server_info keys that change which tokens the model writes; everything else (addresses, timestamps,
# parallelism, memory sizes measured from free GPU memory at start, parsers the native /generate never runs)
# differs between replicas and restarts with the same data, and must not refuse a resume.
DATA_SERVER_KEYS: tuple[str, ...] = (
    "revision", "dtype", "quantization", "kv_cache_dtype", "context_length", "chat_template",
    "json_model_override_args", "enable_deterministic_inference", "skip_tokenizer_init",
)  # fmt: skip


def tokenizer_files(tokenizer_dir: Path) -> list[Path]:
    files = []
    for path in sorted(tokenizer_dir.iterdir()):
        if not path.is_file() or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        if any(fnmatch.fnmatch(path.name, pattern) for pattern in TOKENIZER_FILE_PATTERNS):
            files.append(path)
    return files


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer_dir: Path) -> dict[str, Any]:
    hashes = {path.name: sha256_bytes(path.read_bytes()) for path in tokenizer_files(tokenizer_dir)}
    return {"files": hashes, "sha256": sha256_bytes(orjson.dumps(hashes, option=orjson.OPT_SORT_KEYS))}


def chat_template_sha256(template: str | dict[str, str] | None) -> str | None:
    if template is None:
        return None
    data = template.encode() if isinstance(template, str) else orjson.dumps(template, option=orjson.OPT_SORT_KEYS)
    return sha256_bytes(data)


def server_fingerprint(server_info: dict[str, Any]) -> dict[str, Any]:
    """The server's version and its data-affecting args (an allowlist: an unknown key never refuses a resume)."""
    args = {key: server_info.get(key) for key in DATA_SERVER_KEYS}
    return {"version": server_info.get("version"), "args": args}


def build_fingerprint(
    *,
    tokenizer: dict[str, Any],
    chat_template: str | None,
    server: dict[str, Any],
    sampling: dict[str, Any],
    preset: str | None,
    thinking: bool,
) -> dict[str, Any]:
    """Samples per prompt is deliberately not part of it: raising it later extends a run (sample k is
    sent with seed + k either way)."""
    return {
        "tokenizer": tokenizer,
        "chat_template_sha256": chat_template,
        "server": server,
        "sampling": dict(sorted(sampling.items())),
        "preset": preset,
        "thinking": thinking,
    }


def prelaunch_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between an output's fingerprint and the run's, on everything known before a server runs
    (tokenizer files, chat template, sampling, preset, thinking): a refused resume costs no model load."""
    without_server = lambda fingerprint: {k: v for k, v in fingerprint.items() if k != "server"}  # noqa: E731
    return diff_fingerprints(without_server(recorded), without_server(current))


def fingerprint_sha256(fingerprint: dict[str, Any]) -> str:
    return sha256_bytes(orjson.dumps(fingerprint, option=orjson.OPT_SORT_KEYS))


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


_MISSING = object()


def diff_fingerprints(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human lines naming each changed field: `sampling.temperature: 0.6 -> 0.7`."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(recorded, "", old)
    _flatten(current, "", new)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, _MISSING), new.get(key, _MISSING)
        if before == after or key == "tokenizer.sha256":
            continue
        show_before = "(absent)" if before is _MISSING else _short(before)
        show_after = "(absent)" if after is _MISSING else _short(after)
        lines.append(f"{key}: {show_before} -> {show_after}")
    return lines


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode()
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + "…"
    return text if len(text) <= 120 else text[:117] + "..."
