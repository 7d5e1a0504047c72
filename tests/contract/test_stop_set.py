"""The model's part of the stop set as SGLang reads it (pinned wheel): `ModelConfig._get_hf_eos_token_id` over
config.json and generation_config.json of --model-path. Ours (`engine/model_configs.py`) reads the same ids from
the same directory, including when the tokenizer lives in another one with other eos ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from datagen_operator.engine.model_configs import model_config_dir, read_model_eos_ids
from tests.contract import sglang_sim_side
from tests.contract.conftest import SGLang


@pytest.mark.parametrize(("config_eos", "generation_eos"), [(11, [12, 13]), ([11, 12], None), (None, 14), (7, 7)])
def test_the_models_eos_ids_are_sglangs(
    sglang: SGLang, standin_tokenizer: Path, tmp_path: Path, config_eos: object, generation_eos: object
) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config = json.loads((standin_tokenizer / "config.json").read_text())
    config["eos_token_id"] = config_eos
    (model_dir / "config.json").write_text(json.dumps(config))
    if generation_eos is not None:
        (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    # The tokenizer elsewhere, with its own configs' eos: SGLang never reads those.
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(standin_tokenizer, tokenizer_dir)
    ours = read_model_eos_ids(model_config_dir(model_dir, tokenizer_dir) or tokenizer_dir)
    assert sorted(ours) == sglang.call(sglang_sim_side.model_eos_ids, str(model_dir))
