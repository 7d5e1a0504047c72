"""Where a run's tokenizer comes from on this machine, and why it cannot be loaded, in one line naming the field
and the fix: `datagen run` and `datagen preflight` refuse a missing one the same way, and `--standin` means the
same to both (build the preset's stand-in tokenizer where the directory does not exist)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datagen_operator.api.spec import DataGenRunSpec


class TokenizerUnavailable(Exception):
    """The tokenizer directory cannot be loaded: the message names the spec field and the fix."""


def missing_tokenizer_dir(
    spec: DataGenRunSpec, directory: Path, *, standin: bool, use_real: bool = False
) -> str | None:
    """Why a missing tokenizer directory stops the run, or None when --standin may build the stand-in there."""
    field = spec.model.tokenizer_field
    missing = f"{field}: {directory} does not exist on this machine"
    if use_real:
        return f"{missing}; point it at the model directory (SGLang loads the weights from there)"
    if not standin:
        return (
            f"{missing}; point it at the model directory (or spec.model.tokenizerPath at a local tokenizer), or "
            "pass --standin to build the preset's stand-in tokenizer there for a simulator run (synthetic data, "
            "not model output)"
        )
    if spec.model.preset is None:
        return (
            f"{missing}; --standin builds a preset's stand-in and spec.model.preset is not set: set it, or build one "
            f"with datagen standin-tokenizer --preset PRESET --out {directory}"
        )
    return None


def load_spec_tokenizer(spec: DataGenRunSpec, directory: Path, trust_remote_code: bool) -> Any:
    """The tokenizer in `directory`; TokenizerUnavailable (one line, the field and the fix) when it will not load:
    transformers' own error is a traceback that ends by looking for the path on huggingface.co."""
    from datagen_operator.prompts.render import load_tokenizer

    if not directory.is_dir():
        message = missing_tokenizer_dir(spec, directory, standin=False)
        assert message is not None
        raise TokenizerUnavailable(message)
    try:
        return load_tokenizer(directory, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises OSError, ValueError, or a remote-code class's own error
        cause = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise TokenizerUnavailable(
            f"{spec.model.tokenizer_field}: {directory} holds no tokenizer that loads ({type(error).__name__}: "
            f"{cause}); point it at the model's directory with its tokenizer files (tokenizer_config.json and "
            "tokenizer.json or the model's own), or spec.model.tokenizerPath at a local tokenizer"
        ) from error
