"""A worker output holding one prompt of each set-aside cause, for the `datagen verify` tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api import parse_spec
from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.verify import verify_output
from tests.harness.sim import start_sim
from tests.worker.simrun import SIM_FLAGS, progress, prompts, run_inprocess, spec, standin, write_dataset

SAMPLES = 2


def produce(folder: Path) -> tuple[dict[str, Any], Path, Path]:
    """A worker output over 6 good prompts and one of each set-aside cause, on a 600-token context."""
    items = prompts(6, tools_every=0)
    items.append({"id": "too-long", "messages": [{"role": "user", "content": "a long question " * 40}]})
    # The template reads a tool call with .get(): a bare number cannot be rendered.
    history = {"role": "assistant", "content": "a", "tool_calls": [5]}
    items.append({"id": "unrenderable", "messages": [history, {"role": "user", "content": "q"}]})
    bad = {
        1: orjson.dumps({"id": "bad-tools", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "f"}]}),
        2: b"{not json",
        4: orjson.dumps(items[0]),  # a duplicate of p0000: its entry names p0000, which is not set aside
    }
    dataset = write_dataset(folder / "prompts.jsonl", items, bad)
    output = folder / "out"
    document = spec(dataset, output, **{"generation.samplesPerPrompt": SAMPLES})
    with start_sim(*SIM_FLAGS, "--context-length", "600", tokenizer_dir=standin()) as sim:
        assert run_inprocess(document, [sim.url]) == EXIT_OK
        state = progress(output)
        assert state["set_aside"] == {
            "bad_json": 1, "duplicate_id": 1, "invalid_tools": 1, "too_long": 1, "unrenderable": 1
        }  # fmt: skip
        assert (state["records_done"], state["records_set_aside"], state["records_rejected"]) == (12, 4, 0)
    return document, dataset, output


def verify_produced(document: dict[str, Any], dataset: Path | None, output: Path):
    spec_model = parse_spec(document)
    return verify_output(
        output, spec_model, tokenizer=load_tokenizer(standin(), trust_remote_code=False), dataset=dataset
    )
