"""The model's own configs as SGLang reads them: config.json and generation_config.json from --model-path
(sglang/srt/configs/model_config.py `ModelConfig`), whatever directory the tokenizer comes from. One rule for
the checks' stop set and the simulator's."""

from __future__ import annotations

import json
from pathlib import Path

MODEL_CONFIG_FILES = ("config.json", "generation_config.json")


def model_config_dir(model_path: str | Path, fallback: str | Path | None) -> Path | None:
    """Where SGLang reads the eos ids of the model's configs: the model directory (`ModelConfig(model_path)`:
    hf_config and `get_generation_config(model_path)`), never the tokenizer's. `fallback` (the tokenizer's
    directory) only where the model directory is not readable here, e.g. a verify away from the model."""
    model_dir = Path(model_path)
    if any((model_dir / name).is_file() for name in MODEL_CONFIG_FILES):
        return model_dir
    return Path(fallback) if fallback is not None else None


def read_model_eos_ids(model_dir: Path | None) -> frozenset[int]:
    """`eos_token_id` of config.json and generation_config.json: ids SGLang stops at (SGLang 0.5.23
    sglang/srt/configs/model_config.py `_get_hf_eos_token_id`); none without a directory (`model_config_dir`)."""
    if model_dir is None:
        return frozenset()
    ids: set[int] = set()
    for name in MODEL_CONFIG_FILES:
        try:
            value = json.loads((model_dir / name).read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        values = value if isinstance(value, list) else [value]
        ids |= {item for item in values if isinstance(item, int) and not isinstance(item, bool)}
    return frozenset(ids)
