"""A worker on a preflighted output sends the preflight's rendered prompts before it imports transformers
(worker/inputs.py, output/rendered.py `start_key`), records exactly what a worker that rendered them itself records,
and writes nothing when the tokenizer it then loads disagrees with what those first requests carried."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api.commands import PreflightCommand
from datagen_operator.api.exit_codes import EXIT_FINGERPRINT_MISMATCH, EXIT_OK
from datagen_operator.api.reasons import Reason
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records, iter_rejects
from tests.harness.sim import start_sim
from tests.manifests import run_document, write_run
from tests.programs import run_program
from tests.worker.simrun import (
    REPO,
    SIM_FLAGS,
    check_records,
    progress,
    prompts,
    run_inprocess,
    spawn,
    spec,
    standin,
    write_dataset,
)


@pytest.fixture(scope="module")
def sim():
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        yield server


def _preflighted(tmp_path: Path, items: list[dict[str, Any]], name: str, **changes: Any) -> dict[str, Any]:
    """A run's spec whose output the preflight has checked, pinned and rendered (as `datagen run` does first)."""
    dataset = write_dataset(tmp_path / f"{name}.jsonl", items)
    document = spec(dataset, tmp_path / name, **changes)
    run = write_run(tmp_path / f"{name}.yaml", run_document(document, name))
    done = run_program(PreflightCommand(run=str(run)), cwd=REPO)
    verdict = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["passed"], verdict
    assert (OutputLayout(tmp_path / name).rendered / "meta.json").is_file()
    return document


def _worker(document: dict[str, Any], server: str, log: Path) -> int:
    """The worker as its own process (nothing imported beforehand), its JSON log in `log`."""
    worker = spawn(document, [server], "--render-processes", "0", log=log)
    return worker.wait(120)


def _log(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]


def _first_request(log: Path) -> dict[str, Any]:
    [first] = [line for line in _log(log) if line.get("first_request")]
    return first


def test_a_preflighted_worker_sends_before_transformers_and_records_what_it_would_have_rendered(
    tmp_path: Path, sim
) -> None:
    items = prompts(30)
    document = _preflighted(tmp_path, items, "early")
    log = tmp_path / "early.log"
    assert _worker(document, sim.url, log) == EXIT_OK, log.read_text()[-3000:]
    first = _first_request(log)
    assert first["transformers_imported"] is False and first["tokenizer_loaded"] is False, first
    early = check_records(tmp_path / "early", items, servers={sim.url})  # the reference renderer's ids

    bare = spec(write_dataset(tmp_path / "bare.jsonl", items), tmp_path / "bare")  # no preflight: renders itself
    assert run_inprocess(bare, [sim.url]) == EXIT_OK
    rendered = check_records(tmp_path / "bare", items, servers={sim.url})
    assert {r["id"]: r["input_ids"] for r in early} == {r["id"]: r["input_ids"] for r in rendered}
    counts = ("records_done", "prompt_tokens", "records_set_aside", "records_rejected", "records_failed")
    assert {k: progress(tmp_path / "early")[k] for k in counts} == {k: progress(tmp_path / "bare")[k] for k in counts}
    assert progress(tmp_path / "early")["records_done"] == len(items)
    # The same data fingerprint: the stored sampling and template claim the output as the tokenizer would.
    assert progress(tmp_path / "early")["fingerprint_sha256"] == progress(tmp_path / "bare")["fingerprint_sha256"]


def test_conversations_send_their_first_turns_early_and_the_later_ones_once_the_tokenizer_is_loaded(
    tmp_path: Path, sim
) -> None:
    def conversation(i: int) -> list[dict[str, str]]:
        asked, answered = {"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "An answer."}
        return [asked, answered, {"role": "user", "content": f"And {i} more?"}]

    items = [{"id": f"c{i}", "messages": conversation(i)} for i in range(12)]
    document = _preflighted(tmp_path, items, "turns", **{"generation.turns": "all"})
    log = tmp_path / "turns.log"
    assert _worker(document, sim.url, log) == EXIT_OK, log.read_text()[-3000:]
    assert _first_request(log)["transformers_imported"] is False
    records = list(iter_records(tmp_path / "turns"))
    assert Counter(r.get("turn", 0) for r in records) == {0: 12, 1: 12}
    assert progress(tmp_path / "turns")["records_by_turn"] == {"0": 12, "1": 12}


def test_a_store_the_tokenizer_disagrees_with_stops_the_shard_and_writes_nothing(tmp_path: Path, sim) -> None:
    """meta.json's stored sampling edited (a stop id the tokenizer does not give): the first requests carry it,
    the tokenizer loaded after them disagrees, and the shard stops naming it; no record, no reject written."""
    items = prompts(30)
    document = _preflighted(tmp_path, items, "tampered")
    meta_file = OutputLayout(tmp_path / "tampered").rendered / "meta.json"
    meta = orjson.loads(meta_file.read_bytes())
    meta["start"]["sampling"]["stop_token_ids"] = [*meta["start"]["sampling"]["stop_token_ids"], 7]
    meta_file.write_bytes(orjson.dumps(meta))
    log = tmp_path / "tampered.log"
    assert _worker(document, sim.url, log) == EXIT_FINGERPRINT_MISMATCH, log.read_text()[-3000:]
    assert _first_request(log)["tokenizer_loaded"] is False  # the early requests went out
    shard = progress(tmp_path / "tampered")
    assert shard["failure_reason"] == Reason.FINGERPRINT_MISMATCH
    assert "disagree with this worker's tokenizer on sampling" in shard["message"], shard["message"]
    assert list(iter_records(tmp_path / "tampered")) == []
    assert list(iter_rejects(tmp_path / "tampered")) == []
    assert shard["records_done"] == 0


def test_a_store_of_other_settings_is_not_sent_before_the_tokenizer(tmp_path: Path, sim) -> None:
    """The preflight ran with another temperature (its stored sampling is not this run's): the worker loads the
    tokenizer first, as without a store, and still sends the stored ids (the same render identity)."""
    items = prompts(10)
    document = _preflighted(tmp_path, items, "other")
    document["generation"]["sampling"]["temperature"] = 0.7
    log = tmp_path / "other.log"
    assert _worker(document, sim.url, log) == EXIT_OK, log.read_text()[-3000:]
    assert _first_request(log)["tokenizer_loaded"] is True
    said = [line["msg"] for line in _log(log) if "preflight" in line["msg"]]
    assert any("the tokenizer loaded first: the preflight ran with another settings" in msg for msg in said), said
    check_records(tmp_path / "other", items, servers={sim.url})
