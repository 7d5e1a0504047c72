"""Render once: the preflight's rendered prompts are what the workers send (output/rendered.py)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from datagen_operator.api.commands import PreflightCommand
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.rendered import RenderedWriter, open_rendered
from tests.programs import run_program

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, tokenizer: Path, lines: list[dict]) -> Path:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    run = {
        "apiVersion": API_GROUP_VERSION,
        "kind": "DataGenRun",
        "metadata": {"name": "once"},
        "spec": {
            "model": {"preset": "kimi-k2.5", "path": str(tokenizer)},
            "dataset": {"path": str(dataset)},
            "generation": {"sampling": {"max_new_tokens": 16}},
            "output": {"path": str(tmp_path / "out")},
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    return path


def _preflight(run: Path) -> dict:
    done = run_program(PreflightCommand(run=str(run)), cwd=REPO)
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def test_the_preflight_stores_each_prompt_as_the_renderer_renders_it(tmp_path: Path, standin_tokenizer: Path) -> None:
    from datagen_operator.api import load_run
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.output.rendered import render_identity
    from datagen_operator.prompts.pin import prompt_hash, read_pin, render_date
    from datagen_operator.prompts.render import Renderer, load_tokenizer, template_variables

    lines = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"question {i} " * (i + 1)}]} for i in range(40)]
    lines.insert(7, {"id": "bad", "messages": "not a list"})  # set aside: no ids stored for its position
    run = _run(tmp_path, standin_tokenizer, lines)
    verdict = _preflight(run)
    assert verdict["passed"], verdict
    output = tmp_path / "out"
    spec = load_run(str(run)).spec
    renderer = Renderer(
        load_tokenizer(standin_tokenizer, trust_remote_code=False),
        template_variables(resolve_model(spec), render_date(output)),
    )
    identity = render_identity(
        renderer.template, renderer.variables, standin_tokenizer, "last", history_reasoning="keep"
    )
    store = open_rendered(output, identity, read_pin(output).sha256)
    assert not isinstance(store, str), store
    for position, line in enumerate(lines):
        ids = store.ids(position, prompt_hash(line))
        if line["id"] == "bad":
            assert ids is None
            continue
        assert ids is not None
        assert list(memoryview(ids).cast("i")) == renderer.reference(line["messages"], None)
        assert store.ids(position, prompt_hash(line) ^ 1) is None  # an edited line is never sent with stale ids
    # Another renderer (another thinking switch) or another dataset version: not used.
    assert isinstance(
        open_rendered(output, {**identity, "variables": {"thinking": False}}, read_pin(output).sha256), str
    )
    assert isinstance(open_rendered(output, identity, "0" * 64), str)


def test_a_refused_preflight_keeps_no_rendered_prompts(tmp_path: Path, standin_tokenizer: Path) -> None:
    lines = [{"id": "p0", "messages": "not a list"}, {"id": "p1", "messages": 3}]
    verdict = _preflight(_run(tmp_path, standin_tokenizer, lines))
    assert not verdict["passed"]
    assert not (OutputLayout(tmp_path / "out").rendered / "meta.json").exists()


def test_a_store_without_its_meta_is_not_read(tmp_path: Path) -> None:
    """A preflight killed while writing: ids and lines on disk, no meta.json: the workers render themselves."""
    writer = RenderedWriter(tmp_path)
    writer.add(0, 11, b"\x01\x00\x00\x00")
    assert open_rendered(tmp_path, {}, "x") == "no prompts rendered by the preflight"
    writer.add(2, 12, None)
    with pytest.raises(ValueError):
        writer.add(1, 13, None)  # positions only grow


def test_a_worker_finds_the_store_by_files_alone_and_a_changed_model_config_misses_it(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    """The key a worker reads without transformers (`start_key`) is the preflight's for the same files and spec;
    an eos id edited in generation_config.json (a stop id: the stored sampling would be stale) misses the store."""
    import json
    import shutil

    from datagen_operator.api import load_run
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.output.rendered import open_rendered_early, start_key
    from datagen_operator.prompts.pin import read_pin, render_date
    from datagen_operator.prompts.render import template_variables

    lines = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(5)]
    run = _run(tmp_path, standin_tokenizer, lines)
    assert _preflight(run)["passed"]
    output, spec = tmp_path / "out", load_run(str(run)).spec
    resolved = resolve_model(spec)
    variables = template_variables(resolved, render_date(output))
    pin = read_pin(output).sha256
    store = open_rendered_early(output, start_key(spec, resolved, standin_tokenizer, variables), pin)
    assert not isinstance(store, str), store
    assert set(store.start) == {"key", "sampling", "chat_template_sha256"}
    assert store.start["sampling"]["max_new_tokens"] == 16 and store.start["sampling"]["stop_token_ids"]

    model = tmp_path / "model"
    shutil.copytree(standin_tokenizer, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": 7}))
    moved = spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(model)})})
    missed = open_rendered_early(output, start_key(moved, resolved, model, variables), pin)
    assert missed == "the preflight ran with another configs"
