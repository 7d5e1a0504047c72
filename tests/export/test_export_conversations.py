"""`datagen export` of regenerated conversations (generation.turns: all): one exact row per recorded turn, whole
conversations as one row with the loss over every answer it holds verbatim (a template that re-renders earlier
answers counted under each --rerendered-spans), a conversation missing a turn left out and counted, and the
conversations as text round-tripping the model's answers.

Two kinds of outputs: ones the store's own writer builds by hand (exact, every case named: a crash's duplicate
segments, a missing turn, a shard still running), and ones the real worker made against the simulator: the Kimi
stand-in with thinking off (its template renders an earlier answer exactly as generated: verbatim) and the Qwen3
stand-in with thinking on (its template drops earlier reasoning: re-rendered)."""

from __future__ import annotations

import itertools
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import yaml

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.cli import main as datagen
from datagen_operator.export.conversations import TurnShape, conversation_row, conversation_verdict, tokens_digest
from datagen_operator.export.exporter import export_output
from datagen_operator.export.formats import IGNORE_INDEX, Selection
from datagen_operator.export.manifest import read_export_manifest
from datagen_operator.export.options import DatasetSource, ExportOptions
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import MANIFEST_FORMAT, update_manifest
from datagen_operator.output.parquet import compact_shard
from datagen_operator.output.readers import iter_records, iter_rejects
from datagen_operator.prompts.conversation import plan_turns
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.tokenizer.standin import ensure_standin
from tests.export.store_output import STOP, make_record, write_shard
from tests.harness.sim import start_sim
from tests.specforge_wheel import import_specforge
from tests.worker.simrun import SIM_FLAGS, run_inprocess, spec, standin, write_dataset

Key = tuple[str, int, int]
Conversation = tuple[str, int]


def read_rows(out: Path) -> list[dict[str, Any]]:
    parts = sorted((out / "data").glob("part-*"))
    if parts and parts[0].suffix == ".parquet":
        return [row for part in parts for row in pq.read_table(part).to_pylist()]
    return [orjson.loads(line) for part in parts for line in part.read_bytes().splitlines()]


def export(output: Path, out: Path, export_format: str, **options: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    manifest = export_output(output, out, ExportOptions(export_format, **options))
    return manifest, read_rows(out)


def by_conversation(output: Path) -> dict[Conversation, list[dict[str, Any]]]:
    """The store's own reader is the oracle: each conversation's records in turn order."""
    found: dict[Conversation, list[dict[str, Any]]] = {}
    for record in iter_records(output):
        found.setdefault((record["id"], record["sample"]), []).append(record)
    for records in found.values():
        records.sort(key=lambda record: record.get("turn") or 0)
    return found


def mask_of(row: dict[str, Any]) -> list[int]:
    return list(row.get("loss_mask") or row["assistant_masks"])


# --- an output built by hand with the store's writer ------------------------------------------------------


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def turn_record(
    prompt_id: str, turn: int, input_ids: list[int], output_ids: list[int], **fields: Any
) -> dict[str, Any]:
    record = make_record(prompt_id, 0, input_ids, output_ids, **fields)
    record |= {"turn": turn, "answer_content": f"answer {prompt_id} {turn}", "answer_reasoning": f"why {turn}"}
    return record


def verbatim_turns(prompt_id: str, turns: int, *, base: int) -> list[dict[str, Any]]:
    """Each turn's prompt = the previous turn's prompt + its answer + the next user turn: every answer verbatim."""
    records, prompt = [], [1, base, 2]
    for turn in range(turns):
        answer = [base + 10 * turn + k for k in range(1, 4)] + [STOP]
        records.append(turn_record(prompt_id, turn, list(prompt), answer))
        prompt = [*prompt, *answer, 3, base + 100 + turn, 2]
    return records


def chat_line(prompt_id: str, user_turns: int) -> dict[str, Any]:
    messages = [
        message
        for turn in range(user_turns)
        for message in (user(f"{prompt_id}{turn + 1}"), {"role": "assistant", "content": "dataset answer"})
    ]
    return {"id": prompt_id, "messages": messages}


STORE_DATASET = [chat_line(prompt_id, turns) for prompt_id, turns in (("v", 3), ("r", 2), ("m", 3), ("c", 2),
                                                                     ("f", 2), ("u", 2))]  # fmt: skip


@pytest.fixture(scope="module")
def store_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard 0 compacted with its segments left behind (a crash before their removal: every turn twice on disk):
    `v` (3 turns, verbatim), `r` (its turn 1 prompt re-renders turn 0's answer), `m` (turn 1 never recorded),
    `c` (cut after turn 0: a rejects.jsonl entry), `f` (a flagged turn). Shard 1 still running (segments only):
    `u`, both turns recorded."""
    root = tmp_path_factory.mktemp("store") / "out"
    layout = OutputLayout(root)
    v = verbatim_turns("v", 3, base=1000)
    r0, r1 = verbatim_turns("r", 2, base=2000)
    r1 = {**r1, "input_ids": [x for x in r1["input_ids"] if x != 2002]}  # the template dropped a token of the answer
    m = [verbatim_turns("m", 3, base=3000)[t] for t in (0, 2)]
    c = verbatim_turns("c", 1, base=4000)
    f0, f1 = verbatim_turns("f", 2, base=5000)
    f1 = {**f1, "flags": ["empty_reasoning"]}
    u = verbatim_turns("u", 2, base=6000)
    shard0 = [*v, r0, r1, *m, *c, f0, f1]
    update_manifest(
        layout,
        lambda _: {
            "format": MANIFEST_FORMAT,
            "fingerprint_sha256": "f" * 64,
            "fingerprint": {"turns": "all"},
            "shard_count": 2,
            "shards": {"0": {"state": "complete"}, "1": {"state": "running"}},
        },
    )
    write_shard(layout, 0, shard0)
    compact_shard(layout, 0, 2, [(x["id"], 0, x["turn"]) for x in shard0], remove_segments=False)
    write_shard(layout, 1, u)
    cut = {"key": "turns:c#0@1", "kind": "turns", "cause": "answer_unfinished", "id": "c", "sample": 0, "turn": 1,
           "turns": 2, "line": 3, "reason": "turn 0's answer ended with 'length'"}  # fmt: skip
    with layout.rejects(0).open("ab") as file:
        file.write(orjson.dumps(cut) + b"\n")
    write_dataset(root.parent / "chats.jsonl", STORE_DATASET)
    return root


def store_dataset(output: Path) -> DatasetSource:
    return DatasetSource(DatasetRef(output.parent / "chats.jsonl"))


def test_per_turn_rows_keep_every_turn_once_with_its_turn(store_output: Path, tmp_path: Path) -> None:
    records = {(r["id"], r["sample"], r["turn"]): r for r in iter_records(store_output)}
    assert len(records) == 12  # the store's reader: every turn once, the leftover segments' copies dropped
    for export_format in ("speculators", "trl"):
        manifest, rows = export(store_output, tmp_path / export_format, export_format)
        keys = Counter((row["id"], row["sample"], row["turn"]) for row in rows)
        assert keys == Counter(list(records)), export_format  # keyed (id, sample) the export kept one turn of each
        for row in rows:
            record = records[(row["id"], row["sample"], row["turn"])]
            assert row["input_ids"] == record["input_ids"] + record["output_ids"]
            assert mask_of(row) == [0] * len(record["input_ids"]) + [1] * len(record["output_ids"])
            meta = row.get("metadata") or row
            assert (meta["spans_supervised"], meta["spans_rerendered"]) == (1, 0)
        assert manifest["counts"]["records_read"] == manifest["counts"]["rows_written"] == 12
        assert manifest["source"]["turns"] == "all" and manifest["options"]["rows"] == "turns"
    manifest, _ = export(
        store_output,
        tmp_path / "flagged",
        "speculators",
        selection=Selection(exclude_flags=frozenset({"empty_reasoning"})),
    )
    assert manifest["left_out_examples"] == {"flag:empty_reasoning": ["f#0@1"]}  # named (id, sample, turn)


def expected_store_row(records: list[dict[str, Any]], verbatim: set[int]) -> tuple[list[int], list[int]]:
    """By hand: the last record's ids, 1 over its completion and over each earlier answer listed as verbatim."""
    last = records[-1]
    ids = last["input_ids"] + last["output_ids"]
    mask = [0] * len(last["input_ids"]) + [1] * len(last["output_ids"])
    for record in records[:-1]:
        if record["turn"] in verbatim:
            start = len(record["input_ids"])
            mask[start : start + len(record["output_ids"])] = [1] * len(record["output_ids"])
    return ids, mask


@pytest.mark.parametrize("export_format", ["speculators", "trl"])
def test_conversation_rows_from_the_store_with_the_dataset(
    store_output: Path, tmp_path: Path, export_format: str
) -> None:
    conversations = by_conversation(store_output)
    manifest, rows = export(
        store_output, tmp_path, export_format, rows="conversations", dataset=store_dataset(store_output)
    )
    by_key = {(row["id"], row["sample"]): row for row in rows}
    assert set(by_key) == {("v", 0), ("r", 0), ("u", 0)}
    assert manifest["left_out"] == {
        "turn_flag:empty_reasoning": 1,
        "turns_cut:answer_unfinished": 1,
        "turns_missing": 1,
    }
    assert manifest["left_out_examples"]["turns_missing"] == ["m#0"]
    for key, verbatim, rerendered in ((("v", 0), {0, 1}, 0), (("r", 0), set(), 1), (("u", 0), {0}, 0)):
        ids, mask = expected_store_row(conversations[key], verbatim)
        row = by_key[key]
        assert row["input_ids"] == ids and mask_of(row) == mask, key
        assert row["turn"] == conversations[key][-1]["turn"]
        meta = row.get("metadata") or row
        assert (meta["spans_supervised"], meta["spans_rerendered"]) == (1 + len(verbatim), rerendered)
        assert meta["unfinished"] is (key == ("u", 0))  # read from the running shard's segments
        if export_format == "trl":
            assert row["labels"] == [i if m else IGNORE_INDEX for i, m in zip(ids, mask, strict=True)]
    counts = manifest["counts"]
    assert counts["conversations_read"] == 6 and counts["rows_written"] == 3
    assert (counts["conversation_spans_verbatim"], counts["conversation_spans_rerendered"]) == (3, 1)
    assert counts["supervised_tokens"] == sum(sum(mask_of(row)) for row in rows)


def test_without_the_dataset_only_a_finished_shard_proves_a_conversation_whole(
    store_output: Path, tmp_path: Path
) -> None:
    manifest, rows = export(store_output, tmp_path, "speculators", rows="conversations")
    assert {(row["id"], row["sample"]) for row in rows} == {("v", 0), ("r", 0)}
    # m's gap shows without the dataset; u's shard is still running: more turns may come.
    assert manifest["left_out"] == {
        "turn_flag:empty_reasoning": 1, "turns_cut:answer_unfinished": 1, "turns_missing": 1, "turns_unsettled": 1,
    }  # fmt: skip


def test_drop_row_leaves_out_a_conversation_with_a_rerendered_answer(store_output: Path, tmp_path: Path) -> None:
    manifest, rows = export(
        store_output, tmp_path, "speculators", rows="conversations", rerendered_spans="drop-row",
        dataset=store_dataset(store_output),
    )  # fmt: skip
    assert {(row["id"], row["sample"]) for row in rows} == {("v", 0), ("u", 0)}
    assert manifest["left_out"]["rerendered_span"] == 1 and manifest["left_out_examples"]["rerendered_span"] == ["r#0"]
    assert manifest["counts"]["conversation_spans_rerendered"] == 1
    assert manifest["options"]["rerendered_spans"] == "drop-row"


def test_store_conversations_as_text(store_output: Path, tmp_path: Path) -> None:
    manifest, rows = export(store_output, tmp_path, "conversations", dataset=store_dataset(store_output))
    by_key = {(row["id"], row["sample"]): row for row in rows}
    assert set(by_key) == {("v", 0), ("r", 0), ("u", 0)}
    assert by_key[("v", 0)]["conversations"] == [
        message
        for turn in range(3)
        for message in (user(f"v{turn + 1}"), {"role": "assistant", "content": f"answer v {turn}",
                                               "reasoning_content": f"why {turn}"})
    ]  # fmt: skip
    assert by_key[("v", 0)]["tools"] is None and manifest["lossy"] is True
    assert manifest["counts"]["rows_written"] == 3 and manifest["left_out"]["turns_missing"] == 1


def test_whole_conversations_are_refused_for_an_output_of_one_answer_per_line(tmp_path: Path) -> None:
    root = tmp_path / "out"
    layout = OutputLayout(root)
    update_manifest(layout, lambda _: {"format": MANIFEST_FORMAT, "shard_count": 1, "shards": {}})
    write_shard(layout, 0, [make_record("p", 0, [1, 2], [3, STOP])])
    with pytest.raises(ValueError, match=r"generation\.turns: all"):
        export_output(root, tmp_path / "x", ExportOptions("speculators", rows="conversations"))
    with pytest.raises(ValueError, match="token formats"):
        export_output(root, tmp_path / "x", ExportOptions("text", rows="conversations"))


# --- the pure rules -------------------------------------------------------------------------------


def shape(
    turn_ids: list[int], completion: list[int], *, settled: bool = True, flags: frozenset[str] = frozenset()
) -> TurnShape:
    digest = tokens_digest(np.array(turn_ids, np.int32), np.array(completion, np.int32))
    return TurnShape(len(turn_ids), len(completion), digest, flags, settled, False)


def test_an_earlier_answer_is_supervised_only_where_the_row_starts_with_its_record() -> None:
    earlier = shape([1, 2], [5, 6, STOP])
    exact = conversation_row(np.array([1, 2, 5, 6, STOP, 3], np.int32), np.array([7, STOP], np.int32), [earlier])
    assert exact.mask.tolist() == [0, 0, 1, 1, 1, 0, 1, 1] and (exact.spans_supervised, exact.spans_rerendered) == (
        2,
        0,
    )
    # the same answer, its first token re-rendered: the whole span is context
    other = conversation_row(np.array([1, 2, 9, 6, STOP, 3], np.int32), np.array([7, STOP], np.int32), [earlier])
    assert other.mask.tolist() == [0, 0, 0, 0, 0, 0, 1, 1] and (other.spans_supervised, other.spans_rerendered) == (
        1,
        1,
    )


def test_a_conversation_is_whole_only_with_every_planned_turn() -> None:
    ok, unsettled = shape([1], [STOP]), shape([1], [STOP], settled=False)
    assert conversation_verdict({0: ok, 1: ok}, 2, {}) is None
    assert conversation_verdict({0: ok}, 2, {1: "turns_cut:answer_unfinished"}) == "turns_cut:answer_unfinished"
    assert conversation_verdict({0: ok}, 2, {}) == "turns_missing"
    assert conversation_verdict({0: ok, 2: ok}, None, {}) == "turns_missing"
    assert conversation_verdict({0: ok, 1: ok, 2: ok}, 2, {}) == "turns_not_planned"
    assert conversation_verdict({0: ok}, None, {1: "turn_refused"}) == "turn_refused"
    assert conversation_verdict({0: unsettled}, None, {}) == "turns_unsettled"
    assert conversation_verdict({0: unsettled}, 1, {}) is None  # the dataset says it has one turn
    flagged = shape([1], [STOP], flags=frozenset({"truncated"}))
    assert conversation_verdict({0: ok, 1: flagged}, 2, {}) == "turn_flag:truncated"


# --- outputs the real worker made against the simulator ----------------------------------------------------


ORIGINAL = "ORIGINAL-ANSWER"


def chats(count: int, turns_of: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        for t in range(turns_of(i)):
            messages += [user(f"conversation {i} question {t + 1}?"), {"role": "assistant", "content": ORIGINAL}]
        out.append({"id": f"c{i:03d}", "messages": messages})
    return out


def sim_run(root: Path, items: list[dict[str, Any]], flags: tuple[str, ...], model: Path, **changes: Any) -> Path:
    output = root / "out"
    document = spec(write_dataset(root / "chats.jsonl", items), output, **{"generation.turns": "all", **changes})
    with start_sim(*flags, tokenizer_dir=model) as sim:
        assert run_inprocess(document, [sim.url]) == EXIT_OK
    run = {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "sim"}, "spec": document}
    (output / "run.yaml").write_text(yaml.safe_dump(run))  # as `datagen run` leaves it: the dataset found from it
    return output


@pytest.fixture(scope="module")
def kimi_plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kimi stand-in, thinking off: an earlier answer is rendered into history as generated. max_new_tokens 18
    against ~16-token answers: some are cut, which ends their conversation. Deterministic inference: the
    simulator, as SGLang, samples each request anew without it, and the tests count whole conversations."""
    items = chats(16, lambda i: 1 + i % 4)
    changes = {
        "generation.thinking": False,
        "generation.sampling": {"max_new_tokens": 18, "temperature": 0.6},
    }
    return sim_run(
        tmp_path_factory.mktemp("kimi"),
        items,
        (*SIM_FLAGS, "--sim-seed", "5", "--enable-deterministic-inference"),
        standin(),
        **changes,
    )


@cache
def qwen3_dir() -> Path:
    return ensure_standin("qwen3")


@pytest.fixture(scope="module")
def qwen3_thinking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3 stand-in, thinking on: its template drops an earlier answer's reasoning from history."""
    items = chats(10, lambda i: 1 + i % 3)
    flags = (
        "--sim-family", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
        "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3",
        "--enable-deterministic-inference",  # the tests count whole conversations: one output, each time
    )  # fmt: skip
    return sim_run(
        tmp_path_factory.mktemp("qwen3"), items, flags, qwen3_dir(),
        **{"model.preset": "qwen3", "model.path": str(qwen3_dir())},
    )  # fmt: skip


def planned(output: Path) -> dict[str, int]:
    items = [orjson.loads(line) for line in (output.parent / "chats.jsonl").read_bytes().splitlines()]
    return {item["id"]: len(plan_turns(item["messages"])) for item in items}


def whole_by_hand(output: Path) -> dict[Conversation, list[dict[str, Any]]]:
    """The conversations with every planned turn recorded, each ended on a stop, no flag."""
    plans = planned(output)
    return {
        key: records
        for key, records in by_conversation(output).items()
        if [r["turn"] for r in records] == list(range(plans[key[0]]))
        and all(r["finish_reason"]["type"] == "stop" and not r["flags"] for r in records)
    }


def test_sim_per_turn_rows_in_every_format(kimi_plain: Path, tmp_path: Path) -> None:
    records = {(r["id"], r["sample"], r["turn"]): r for r in iter_records(kimi_plain)}
    assert max(key[2] for key in records) >= 2
    for export_format in ("speculators", "trl", "text"):
        out = tmp_path / export_format
        args = ["export", str(kimi_plain), "--format", export_format, "--out", str(out), "--allow-unverified"]
        assert datagen(args) == EXIT_OK
        rows = read_rows(out)
        assert Counter((row["id"], row["sample"], row["turn"]) for row in rows) == Counter(list(records))
        for row in rows:
            record = records[(row["id"], row["sample"], row["turn"])]
            if export_format == "text":
                assert row["roundtrip_ok"] is True
            else:
                assert row["input_ids"] == record["input_ids"] + record["output_ids"]


def test_sim_conversation_rows_supervise_every_verbatim_answer(kimi_plain: Path, tmp_path: Path) -> None:
    whole = whole_by_hand(kimi_plain)
    assert sum(len(records) > 1 for records in whole.values()) >= 3
    expected: dict[Conversation, tuple[list[int], list[int]]] = {}
    for key, records in whole.items():
        for before, after in itertools.pairwise(records):  # the prefix relation, turn by turn
            held = before["input_ids"] + before["output_ids"]
            assert after["input_ids"][: len(held)] == held, key
        expected[key] = expected_store_row(records, {r["turn"] for r in records})
    for export_format in ("speculators", "trl"):
        out = tmp_path / export_format
        args = ["export", str(kimi_plain), "--format", export_format, "--rows", "conversations", "--out", str(out),
                "--allow-unverified"]  # fmt: skip
        assert datagen(args) == EXIT_OK
        manifest, rows = read_export_manifest(out), read_rows(out)
        assert {(row["id"], row["sample"]): (row["input_ids"], mask_of(row)) for row in rows} == expected
        counts = manifest["counts"]
        assert counts["conversation_spans_verbatim"] == sum(len(r) - 1 for r in whole.values())
        assert counts["conversation_spans_rerendered"] == 0
        assert (
            counts["rows_written"] + counts["left_out"]
            == counts["conversations_read"]
            == len(by_conversation(kimi_plain))
        )
        supervised = np.concatenate([np.array(ids)[np.array(mask, bool)] for ids, mask in expected.values()])
        frequency = np.load(out / "token_freq.npy")
        assert np.array_equal(frequency[: supervised.max() + 1], np.bincount(supervised))


def test_sim_a_conversation_missing_a_turn_is_left_out_and_counted(kimi_plain: Path, tmp_path: Path) -> None:
    cut = {(e["id"], e["sample"]) for e in iter_rejects(kimi_plain) if e.get("kind") == "turns"}
    assert cut, "max_new_tokens 18 cuts some answers before a conversation's last turn"
    plans = planned(kimi_plain)
    for dataset in (DatasetSource(DatasetRef(kimi_plain.parent / "chats.jsonl")), None):
        manifest, rows = export(kimi_plain, tmp_path / str(dataset is None), "speculators", rows="conversations",
                                dataset=dataset)  # fmt: skip
        assert not cut & {(row["id"], row["sample"]) for row in rows}
        assert manifest["left_out"]["turns_cut:answer_unfinished"] == len(cut)
        assert set(manifest["left_out_examples"]["turns_cut:answer_unfinished"]) <= {f"{i}#{s}" for i, s in cut}
        for row in rows:
            assert row["turn"] == plans[row["id"]] - 1  # the row is the last planned turn's
    # A dataset planning one more user turn than was answered: the conversation misses its last turn.
    whole = sorted(whole_by_hand(kimi_plain))
    grown_id = whole[0][0]
    items = [orjson.loads(line) for line in (kimi_plain.parent / "chats.jsonl").read_bytes().splitlines()]
    for item in items:
        if item["id"] == grown_id:
            item["messages"].append(user("one more?"))
    grown = write_dataset(tmp_path / "grown.jsonl", items)
    manifest, rows = export(
        kimi_plain, tmp_path / "grown", "trl", rows="conversations", dataset=DatasetSource(DatasetRef(grown))
    )
    assert grown_id not in {row["id"] for row in rows}
    assert manifest["left_out"]["turns_missing"] == 1 and manifest["left_out_examples"]["turns_missing"] == [
        f"{grown_id}#0"
    ]


def test_sim_a_template_dropping_earlier_reasoning_yields_counted_rerendered_spans(
    qwen3_thinking: Path, tmp_path: Path
) -> None:
    whole = whole_by_hand(qwen3_thinking)
    multi = {key for key, records in whole.items() if len(records) > 1}
    assert multi and len(whole) > len(multi)
    for key in multi:
        first, second = whole[key][:2]
        assert first["answer_reasoning"]  # the model reasoned; the next prompt holds the answer without it
        held = first["input_ids"] + first["output_ids"]
        assert second["input_ids"][: len(held)] != held
    spans = sum(len(whole[key]) - 1 for key in multi)
    unmasked, rows = export(qwen3_thinking, tmp_path / "unmasked", "speculators", rows="conversations")
    assert {(row["id"], row["sample"]) for row in rows} == set(whole)
    for row in rows:
        last = whole[(row["id"], row["sample"])][-1]
        assert row["input_ids"] == last["input_ids"] + last["output_ids"]
        assert mask_of(row) == [0] * len(last["input_ids"]) + [1] * len(last["output_ids"])  # earlier: context
        assert row["metadata"]["spans_rerendered"] == len(whole[(row["id"], row["sample"])]) - 1
    assert unmasked["counts"]["conversation_spans_rerendered"] == spans
    assert unmasked["counts"]["conversation_spans_verbatim"] == 0 and "rerendered_span" not in unmasked["left_out"]
    dropped, rows = export(qwen3_thinking, tmp_path / "drop", "trl", rows="conversations", rerendered_spans="drop-row")
    assert {(row["id"], row["sample"]) for row in rows} == set(whole) - multi
    assert dropped["left_out"]["rerendered_span"] == len(multi)
    assert dropped["counts"]["conversation_spans_rerendered"] == spans


def test_sim_conversations_text_round_trips_the_answers(qwen3_thinking: Path, tmp_path: Path) -> None:
    from datagen_operator.api import parse_run
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.prompts.pin import read_pin
    from datagen_operator.prompts.render import Renderer, load_tokenizer, template_variables

    out = tmp_path / "text"
    # verified first (the dataset found from OUTPUT/run.yaml), as any export
    assert datagen(["export", str(qwen3_thinking), "--format", "conversations", "--out", str(out)]) == EXIT_OK
    rows = read_rows(out)
    whole = whole_by_hand(qwen3_thinking)
    assert {(row["id"], row["sample"]) for row in rows} == set(whole)
    items = {
        item["id"]: item
        for item in (orjson.loads(line) for line in (qwen3_thinking.parent / "chats.jsonl").read_bytes().splitlines())
    }
    run = parse_run(yaml.safe_load((qwen3_thinking / "run.yaml").read_text()))
    pin = read_pin(qwen3_thinking)
    variables = template_variables(resolve_model(run.spec), pin.rendered_on if pin else None)
    renderer = Renderer(load_tokenizer(qwen3_dir(), trust_remote_code=False), variables)
    for row in rows:
        records = whole[(row["id"], row["sample"])]
        answers = iter(records)
        expected = []
        for message in items[row["id"]]["messages"]:
            if message["role"] != "assistant":
                expected.append(message)
                continue
            record = next(answers)
            answer = {"role": "assistant", "content": record["answer_content"]}
            if record["answer_reasoning"] is not None:
                answer["reasoning_content"] = record["answer_reasoning"]
            expected.append(answer)
        assert row["conversations"] == expected and ORIGINAL not in orjson.dumps(row).decode()
        assert row["tools"] is None and row["metadata"]["turns"] == len(records)
        # the messages before answer k render to the prompt record k was generated on
        at = [i for i, message in enumerate(row["conversations"]) if message["role"] == "assistant"]
        for record, end in zip(records, at, strict=True):
            assert renderer.reference(row["conversations"][:end], None) == record["input_ids"]
    manifest = read_export_manifest(out)
    assert manifest["export_format"] == "conversations" and manifest["lossy"] is True
    assert manifest["options"]["dataset"] == str(qwen3_thinking.parent / "chats.jsonl")
    assert manifest["token_freq"]["total"] == sum(len(r["output_ids"]) for records in whole.values() for r in records)
    messages = tmp_path / "messages"
    args = ["export", str(qwen3_thinking), "--format", "conversations", "--messages-key", "messages", "--out",
            str(messages)]  # fmt: skip
    assert datagen(args) == EXIT_OK
    assert [row["messages"] for row in read_rows(messages)] == [row["conversations"] for row in rows]


def test_sim_loaders_read_the_conversation_exports(qwen3_thinking: Path, tmp_path: Path) -> None:
    import datasets

    cache_dir = str(tmp_path / "hf")
    args = [
        "export",
        str(qwen3_thinking),
        "--formats",
        "speculators,conversations",
        "--rows",
        "conversations",
        "--out",
        str(tmp_path),
    ]  # fmt: skip  (spec.export's way: each format to OUT/<format>)
    assert datagen(args) == EXIT_OK
    for export_format in ("speculators", "conversations"):
        files = str(tmp_path / export_format / "data" / "part-*.jsonl")
        loaded = datasets.load_dataset("json", data_files=files, split="train", cache_dir=cache_dir)
        assert loaded.num_rows == len(whole_by_hand(qwen3_thinking)) > 0
    assert read_export_manifest(tmp_path / "speculators")["options"]["rows"] == "conversations"


def test_the_conversations_format_needs_the_dataset(kimi_plain: Path, tmp_path: Path) -> None:
    args = ["export", str(kimi_plain), "--format", "conversations", "--out", str(tmp_path), "--allow-unverified",
            "--dataset", str(tmp_path / "missing.jsonl")]  # fmt: skip
    assert datagen(args) == EXIT_BAD_INPUT
    assert not (tmp_path / "export-manifest.json").exists()


def test_sim_conversations_carry_each_lines_chat_template_kwargs(tmp_path: Path) -> None:
    """A thinking run with `enable_thinking: false` on every third line: each row carries what its prompts were
    rendered with as `chat_template_kwargs` (the run's switch, the line's own over it), and a trainer calling
    apply_chat_template with the row's messages, tools and those kwargs gets every turn's prompt back, the off
    lines' included; without them (the template's default) the off lines' prompts differ."""
    items = chats(9, lambda i: 1 + i % 2)
    for i, item in enumerate(items):
        if i % 3 == 2:
            item["chat_template_kwargs"] = {"enable_thinking": False}
    flags = (
        "--sim-family", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
        "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3",
        "--enable-deterministic-inference",  # the tests count whole conversations: one output, each time
    )  # fmt: skip
    (tmp_path / "run").mkdir()
    output = sim_run(
        tmp_path / "run", items, flags, qwen3_dir(), **{"model.preset": "qwen3", "model.path": str(qwen3_dir())}
    )
    out = tmp_path / "conversations"
    assert datagen(["export", str(output), "--format", "conversations", "--out", str(out)]) == EXIT_OK
    rows = read_rows(out)
    whole = whole_by_hand(output)
    assert {(row["id"], row["sample"]) for row in rows} == set(whole)
    off = {item["id"] for item in items if "chat_template_kwargs" in item}
    assert {row["id"] for row in rows if row["chat_template_kwargs"] == {"enable_thinking": False}} == off
    assert all(row["chat_template_kwargs"] == {"enable_thinking": True} for row in rows if row["id"] not in off)
    from datagen_operator.prompts.render import load_tokenizer

    tokenizer = load_tokenizer(qwen3_dir(), trust_remote_code=False)

    def trainer_renders(messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]) -> list[int]:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        return list(ids)

    checked_off = 0
    for row in rows:
        at = [i for i, message in enumerate(row["conversations"]) if message["role"] == "assistant"]
        for record, end in zip(whole[(row["id"], row["sample"])], at, strict=True):
            before = row["conversations"][:end]
            assert trainer_renders(before, row["tools"], row["chat_template_kwargs"]) == record["input_ids"]
            if row["id"] in off:
                assert trainer_renders(before, row["tools"], {}) != record["input_ids"]
                checked_off += 1
    assert checked_off >= 2


def test_sim_exports_say_what_a_trainer_that_re_renders_loses(
    qwen3_thinking: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Qwen3 with thinking on: a trainer that renders the conversations format with the model's template (as
    SpecForge's ThinkingParser does: the whole conversation, no generation prompt, enable_thinking) trains on
    earlier answers without their reasoning, text the model never generated there. `datagen export` measures
    that, counts it in the manifest and warns naming the family; per-turn rows train on every answer once."""
    from datagen_operator.prompts.render import load_tokenizer
    from tests.export.trained import compare

    records = list(iter_records(qwen3_thinking))
    out = tmp_path / "conversations"
    assert datagen(["export", str(qwen3_thinking), "--format", "conversations", "--out", str(out)]) == EXIT_OK
    warning = capsys.readouterr().err
    tokenizer = load_tokenizer(qwen3_dir(), trust_remote_code=False)
    rendered = []
    for row in read_rows(out):
        text = tokenizer.apply_chat_template(
            row["conversations"],
            tokenize=False,
            add_generation_prompt=False,
            add_special_tokens=False,
            tools=row["tools"] or None,
            **{"enable_thinking": True, **(row["chat_template_kwargs"] or {})},
        )  # fmt: skip  (specforge/data/parse.py ThinkingParser.apply_chat_template)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        rendered.append((ids, [1] * len(ids)))
    whole = [r for r in records if (r["id"], r["sample"]) in whole_by_hand(qwen3_thinking)]
    kept = compare(rendered, whole)
    lost_tokens = kept.generated - kept.supervised_in_place
    assert 0 < lost_tokens < kept.generated and kept.generated_more == 0  # earlier answers lost, the last kept
    measured = read_export_manifest(out)["trainer_render"]
    assert measured["measured"] is True
    assert (measured["answers"], measured["tokens"]) == (len(whole), kept.generated)
    assert (measured["answers_lost"], measured["tokens_lost"]) == (kept.records - kept.records_whole, lost_tokens)
    assert "warning: qwen3: a trainer that renders these conversations" in warning
    assert f"({lost_tokens} of {kept.generated} generated tokens, reasoning included" in warning
    # The per-turn rows the warning recommends, loaded by SpecForge's own prompt loader (its pre-tokenized path, as
    # `data.prompts_path` reads them): every generated token supervised once, in place, nothing else.
    turns = tmp_path / "turns"
    assert datagen(["export", str(qwen3_thinking), "--format", "speculators", "--out", str(turns)]) == EXIT_OK
    assert "warning" not in capsys.readouterr().err
    [part] = sorted((turns / "data").glob("part-*.jsonl"))
    tasks = import_specforge("specforge.data.prompt_builder").prepare_prompt_tasks(
        part, None, chat_template=None, max_length=32768, is_preformatted=False, train_only_last_turn=False,
        cache_dir=None, cache_key=None, num_proc=1,
    )  # fmt: skip
    per_turn = compare([(task["payload"]["input_ids"], task["payload"]["loss_mask"]) for task in tasks], records)
    assert per_turn.ratio == 1.0 and per_turn.not_generated == 0 and per_turn.records_whole == len(records)
    # Whole-conversation rows leave the re-rendered earlier answers unsupervised: said, counted.
    rows = tmp_path / "rows"
    args = ["export", str(qwen3_thinking), "--format", "trl", "--rows", "conversations", "--out", str(rows)]
    assert datagen(args) == EXIT_OK
    spans = read_export_manifest(rows)["counts"]["conversation_spans_rerendered"]
    assert spans > 0 and f"warning: qwen3: {spans} earlier answers are held re-rendered" in capsys.readouterr().err
    text = ["export", str(qwen3_thinking), "--format", "text", "--out", str(tmp_path / "text")]
    assert datagen(text) == EXIT_OK
    said = capsys.readouterr().err
    assert "warning: qwen3: a later turn's text holds the earlier answers as the template re-rendered them" in said
    assert "SpecForge's preformatted loader (--is-preformatted) supervises every assistant span" in said
    args = [*args[:-1], str(tmp_path / "drop"), "--rerendered-spans", "drop-row"]
    assert datagen(args) == EXIT_OK
    dropped = read_export_manifest(tmp_path / "drop")["left_out"]["rerendered_span"]
    assert (
        f"re-rendered by the chat template in these whole-conversation rows: their {dropped} conversations left out"
        in capsys.readouterr().err
    )


def test_spec_export_verdict_says_what_a_trainer_that_re_renders_loses(qwen3_thinking: Path, tmp_path: Path) -> None:
    """spec.export (`--formats`, the export Job): the conversations format is measured with the run's tokenizer as
    `datagen export --format conversations` is, and the Exported message says the loss and what to use instead."""
    from datagen_operator.api.outcome import StepOutcome

    log = tmp_path / "termination-log"
    args = ["export", str(qwen3_thinking), "--formats", "speculators,conversations", "--out", str(tmp_path / "x"),
            "--termination-log", str(log)]  # fmt: skip
    assert datagen(args) == EXIT_OK
    outcome = StepOutcome.from_storage(log.read_text())
    measured = read_export_manifest(tmp_path / "x" / "conversations")["trainer_render"]
    assert measured["measured"] is True and measured["tokens_lost"] > 0
    lost = f"({measured['tokens_lost']} of {measured['tokens']} generated tokens lost to a trainer that re-renders"
    assert outcome.passed and lost in outcome.message and "use speculators/trl per-turn rows" in outcome.message
    assert outcome.message.count("generated tokens lost") == 1  # the speculators rows lose nothing
