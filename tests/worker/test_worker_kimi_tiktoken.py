"""The worker, verify and canary on the Kimi-K2.5 stand-in shaped like the real directory (tiktoken.model,
tokenization_kimi.py loaded with trust_remote_code, no tokenizer.json).

The simulator serves the tokenizer.json stand-in (same ids); the workers render with the tiktoken one
through `model.tokenizerPath`, so every record passing `check_records` (whose expected prompts come from
the tokenizer.json stand-in) shows the two give the same prompts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.output.manifest import read_manifest
from datagen_operator.prompts.render import (
    FullSpec,
    Renderer,
    RenderPool,
    backend_encoder,
    ids_from_result,
    lean_spec,
    load_tokenizer,
)
from datagen_operator.tokenizer.kimi_tiktoken import ensure_kimi_tiktoken_standin
from tests.harness.sim import start_sim
from tests.worker.simrun import (
    SIM_FLAGS,
    check_records,
    prompts,
    reference_renderer,
    run_inprocess,
    spec,
    standin,
    write_dataset,
)


@pytest.fixture(scope="module")
def kimi_dir() -> Path:
    return ensure_kimi_tiktoken_standin()


@pytest.fixture(scope="module")
def sim():
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        yield server


def _chats(count: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    return [(item["messages"], item.get("tools")) for item in prompts(count, tools_every=3)]


@pytest.mark.parametrize("thinking", [True, False])
def test_renderer_uses_tiktoken_and_matches_the_standin(kimi_dir: Path, thinking: bool) -> None:
    renderer = Renderer(load_tokenizer(kimi_dir, trust_remote_code=True), {"thinking": thinking})
    assert backend_encoder(renderer.tokenizer) is not None
    # Its class overrides apply_chat_template (as the real remote code does): no prompt is rendered around it,
    # and a render helper loads the remote code with transformers.
    assert renderer.lean is None
    assert lean_spec(renderer, kimi_dir) == "no lean path for this tokenizer or template"
    reference = reference_renderer(thinking)
    for messages, tools in _chats(Renderer.CHECK_FIRST + 8):
        ids = renderer.render(messages, tools)
        assert ids == reference.reference(messages, tools)
        assert ids[-2:] == ([ids[-2], 163606] if thinking else [163606, 163607])
    assert renderer.fast_path_mismatch is None


def test_render_helper_processes_load_the_remote_code(kimi_dir: Path) -> None:
    """Spawned helpers import tokenization_kimi.py themselves (no lean helper without tokenizer.json), and the
    worker holds their ids to its reference as it does a lean helper's."""
    renderer = Renderer(load_tokenizer(kimi_dir, trust_remote_code=True), {"thinking": True})
    pool = RenderPool({"thinking": True}, kimi_dir, True, processes=1)
    pool.renderer = renderer
    try:
        pool._start_helpers("test")
        assert isinstance(pool.helper_spec, FullSpec) and not pool.helper_spec.reference_only
        pool._ready[0].result(timeout=120)
        items = _chats(6)
        results = asyncio.run(pool.render([(messages, tools, None) for messages, tools in items]))
    finally:
        pool.close()
    reference = reference_renderer(True)
    assert [ids_from_result(r) for r in results] == [reference.reference(m, t) for m, t in items]  # type: ignore[arg-type]
    assert renderer.rendered == 0 and renderer.checked == len(items) and renderer.fast_path_mismatch is None


def test_worker_and_verify_on_the_tiktoken_standin(tmp_path: Path, sim, kimi_dir: Path) -> None:
    from datagen_operator.steps import verify_program

    items = prompts(24)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"model.tokenizerPath": str(kimi_dir)})
    assert run_inprocess(document, [sim.url]) == EXIT_OK
    check_records(output, items)
    files = read_manifest(output)["fingerprint"]["tokenizer"]["files"]
    assert {"tiktoken.model", "tokenization_kimi.py"} <= set(files) and "tokenizer.json" not in files
    # verify loads the tokenizer from the spec (tokenizerPath, trust_remote_code from the kimi-k2.5 preset).
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        yaml.safe_dump({"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "k"}})
        + yaml.safe_dump({"spec": document})
    )
    assert verify_program.main([str(output), "--run", str(run_file)]) == 0


def test_canary_on_the_tiktoken_standin(tmp_path: Path, sim, kimi_dir: Path) -> None:
    from datagen_operator.steps import canary

    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(16))
    document = spec(dataset, tmp_path / "out", **{"model.tokenizerPath": str(kimi_dir)})
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        yaml.safe_dump({"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "k"}})
        + yaml.safe_dump({"spec": document})
    )
    assert canary.main(["--run", str(run_file), "--server", sim.url]) == 0
