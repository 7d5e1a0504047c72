"""What an export will train: supervised against generated tokens per format (the manifest's `supervision`, the
CLI's summary line), every count equal to one made by hand from the rows and the store; and the dataset line's
other fields (`source_fields`) carried by the records to every format.

One output the real worker made against the simulator: the Qwen3 stand-in, thinking on (its template drops an
earlier answer's reasoning, so whole-conversation rows hold earlier answers re-rendered), max_new_tokens short
enough that some answers are cut (`truncated`, and their conversation ends: `turns_cut:answer_unfinished`), and
dataset lines carrying fields beside their conversation (metadata, source, category, chat_template_kwargs)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.cli import main as datagen
from datagen_operator.export.manifest import read_export_manifest
from datagen_operator.output.readers import iter_records, iter_rejects
from tests.export.test_export_conversations import (
    by_conversation,
    chats,
    mask_of,
    qwen3_dir,
    read_rows,
    sim_run,
    whole_by_hand,
)

QWEN3_FLAGS = (
    "--sim-family", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25",
    "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3",
    "--sim-seed", "7", "--enable-deterministic-inference",  # with sampling_seed 0: this very output, each time
)  # fmt: skip
EXTRA_FIELDS: list[dict[str, Any]] = [
    {"source": "glaive", "category": "coding", "metadata": {"rank": 1, "tags": ["a", "b"]}},
    {"chat_template_kwargs": {"enable_thinking": False}, "source": "sharegpt"},
    {},
    {"metadata": None, "score": 0.5, "sample": "the line's own `sample` field"},  # collides with a row key
]
"""Line i carries EXTRA_FIELDS[i % 4] beside its id and messages."""


def line_fields(i: int) -> dict[str, Any] | None:
    return EXTRA_FIELDS[i % len(EXTRA_FIELDS)] or None


@pytest.fixture(scope="module")
def qwen3_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    items = chats(14, lambda i: 1 + i % 3)
    for i, item in enumerate(items):
        item.update(EXTRA_FIELDS[i % len(EXTRA_FIELDS)])
    root = tmp_path_factory.mktemp("qwen3")
    changes = {
        "model.preset": "qwen3",
        "model.path": str(qwen3_dir()),
        "generation.sampling": {"max_new_tokens": 44, "temperature": 0.6, "sampling_seed": 0},
    }
    output = sim_run(root, items, QWEN3_FLAGS, qwen3_dir(), **changes)
    records = list(iter_records(output))
    # The output this file needs: cut answers (which end their conversation) and multi-turn whole conversations.
    assert any(record["finish_reason"]["type"] == "length" for record in records)
    assert any(len(turns) > 1 for turns in whole_by_hand(output).values())
    return output


def export_cli(
    output: Path, out: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """`datagen export` as a user runs it: its printed summary, the manifest and the rows."""
    capsys.readouterr()
    assert datagen(["export", str(output), "--out", str(out), "--allow-unverified", *args]) == EXIT_OK
    summary = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return summary, read_export_manifest(out), read_rows(out)


def generated_by_hand(output: Path) -> int:
    return sum(len(record["output_ids"]) for record in iter_records(output))


def assert_summary(summary: dict[str, Any], manifest: dict[str, Any], supervised: int, generated: int) -> None:
    """The manifest and the CLI say the same counts, and the line shows them and their ratio."""
    supervision = manifest["supervision"]
    assert (supervision["supervised_tokens"], supervision["generated_tokens"]) == (supervised, generated)
    assert supervision["ratio"] == round(supervised / generated, 4)
    assert summary["supervised_ratio"] == supervision["ratio"]
    assert summary["supervised_tokens"] == supervised and summary["generated_tokens"] == generated
    assert summary["supervision"].startswith(
        f"supervised / generated = {supervised} / {generated} = {supervised / generated:.2f}"
    )
    assert summary["family"] == "qwen3"
    # Every generated token is supervised or counted under why not, never both.
    assert supervised + sum(supervision["unsupervised_tokens"].values()) == generated
    assert summary["unsupervised_tokens_by"] == supervision["unsupervised_tokens"]


# --- item 3: supervised / generated --------------------------------------------------------------------------


@pytest.mark.parametrize("export_format", ["speculators", "trl"])
def test_per_turn_rows_supervise_every_generated_token_exactly_once(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], export_format: str
) -> None:
    """The recommended format: ratio exactly 1.00, reasoning included; each record's output_ids are the
    supervised tokens of exactly one row, where the model generated them."""
    summary, manifest, rows = export_cli(qwen3_run, tmp_path / "out", capsys, "--format", export_format)
    records = {(r["id"], r["sample"], r["turn"]): r for r in iter_records(qwen3_run)}
    assert any(record["answer_reasoning"] for record in records.values())
    supervised_of: Counter[tuple[str, int, int]] = Counter()
    for row in rows:
        key = (row["id"], row["sample"], row["turn"])
        mask = mask_of(row)
        supervised = [token for token, bit in zip(row["input_ids"], mask, strict=True) if bit]
        assert supervised == records[key]["output_ids"]
        assert row["input_ids"][len(row["input_ids"]) - len(supervised) :] == supervised  # in place: the end
        supervised_of[key] += 1
    assert supervised_of == Counter(list(records))  # every record, once
    generated = generated_by_hand(qwen3_run)
    assert sum(sum(mask_of(row)) for row in rows) == generated
    assert_summary(summary, manifest, generated, generated)
    assert manifest["supervision"]["ratio"] == 1.0 and manifest["supervision"]["unsupervised_tokens"] == {}
    # Turns never generated, by cause, as rejects.jsonl names them; in the line too.
    cut = Counter(
        entry["cause"] for entry in iter_rejects(qwen3_run) if entry.get("kind") == "turns" for _ in range(
            entry["turns"] - entry["turn"]
        )
    )  # fmt: skip
    assert cut and manifest["supervision"]["turns_not_generated"] == {
        f"turns_cut:{cause}": n for cause, n in cut.items()
    }
    assert "turns_cut:answer_unfinished" in summary["supervision"]


def test_left_out_turns_are_counted_in_tokens_by_reason(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary, manifest, rows = export_cli(
        qwen3_run, tmp_path / "out", capsys, "--format", "speculators", "--exclude-flags", "truncated"
    )
    truncated = [r for r in iter_records(qwen3_run) if r["finish_reason"]["type"] == "length"]
    cut_tokens = sum(len(record["output_ids"]) for record in truncated)
    generated = generated_by_hand(qwen3_run)
    assert_summary(summary, manifest, generated - cut_tokens, generated)
    assert manifest["supervision"]["unsupervised_tokens"] == {"flag:truncated": cut_tokens}
    assert sum(sum(mask_of(row)) for row in rows) == generated - cut_tokens
    assert manifest["supervision"]["ratio"] < 1


@pytest.mark.parametrize("export_format", ["speculators", "trl"])
def test_whole_conversation_rows_supervise_only_verbatim_spans_and_say_so(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], export_format: str
) -> None:
    args = ("--format", export_format, "--rows", "conversations")
    summary, manifest, rows = export_cli(qwen3_run, tmp_path / "out", capsys, *args)
    conversations, whole = by_conversation(qwen3_run), whole_by_hand(qwen3_run)
    assert {(row["id"], row["sample"]) for row in rows} == set(whole)
    supervised = sum(sum(mask_of(row)) for row in rows)
    # Qwen3 with thinking: every earlier answer is held re-rendered; only the last is supervised.
    assert supervised == sum(len(turns[-1]["output_ids"]) for turns in whole.values())
    rerendered = sum(len(record["output_ids"]) for turns in whole.values() for record in turns[:-1])
    left_out = sum(
        len(record["output_ids"]) for key, turns in conversations.items() if key not in whole for record in turns
    )
    generated = generated_by_hand(qwen3_run)
    assert rerendered and left_out and supervised + rerendered + left_out == generated
    assert_summary(summary, manifest, supervised, generated)
    unsupervised = manifest["supervision"]["unsupervised_tokens"]
    assert unsupervised.pop("rerendered_span") == rerendered
    assert sum(unsupervised.values()) == left_out and all(reason.startswith("turns_cut:") for reason in unsupervised)
    assert manifest["supervision"]["ratio"] < 1
    assert "whole-conversation rows supervise only the answers they hold verbatim" in summary["supervision"]
    spans = sum(len(turns) - 1 for turns in whole.values())
    assert f"{spans} earlier answers ({rerendered} tokens)" in summary["supervision"]


def test_conversations_and_text_count_the_answers_they_hand_over(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generated = generated_by_hand(qwen3_run)
    whole = whole_by_hand(qwen3_run)
    summary, manifest, rows = export_cli(qwen3_run, tmp_path / "conv", capsys, "--format", "conversations")
    handed = sum(len(record["output_ids"]) for turns in whole.values() for record in turns)
    assert {(row["id"], row["sample"]) for row in rows} == set(whole)
    # Qwen3's template, rendering a whole conversation as SpecForge does, drops the earlier answers' reasoning:
    # those answers are not what that trainer supervises (measured: trainer_render).
    render = manifest["trainer_render"]
    assert render["measured"] and render["tokens"] == handed and 0 < render["tokens_lost"] < handed
    assert manifest["supervision"]["unsupervised_tokens"]["trainer_rerendered"] == render["tokens_lost"]
    assert_summary(summary, manifest, handed - render["tokens_lost"], generated)
    assert f"re-renders {render['tokens_lost']} generated tokens (trainer_render)" in summary["supervision"]

    summary, manifest, rows = export_cli(qwen3_run, tmp_path / "text", capsys, "--format", "text")
    ok = sum(row["metadata"]["completion_tokens"] for row in rows if row["roundtrip_ok"])
    assert_summary(summary, manifest, ok, generated)
    history = sum(row["turn"] for row in rows)
    assert history and manifest["supervision"]["history_answers"] == history
    assert f"also trains on the {history} earlier answers" in summary["supervision"]
    summary, manifest, _ = export_cli(qwen3_run, tmp_path / "split", capsys, "--format", "text", "--last-turn-only")
    assert manifest["supervision"]["history_answers"] == 0 and "earlier answers" not in summary["supervision"]


# --- item 4: the dataset line's other fields -----------------------------------------------------------------


def expected_fields(output: Path) -> dict[str, dict[str, Any] | None]:
    """id -> the line's fields beside id and messages, read from the dataset by hand."""
    lines = [orjson.loads(line) for line in (output.parent / "chats.jsonl").read_bytes().splitlines()]
    return {
        line["id"]: {key: value for key, value in line.items() if key not in ("id", "messages")} or None
        for line in lines
    }


def test_records_carry_the_lines_other_fields(qwen3_run: Path) -> None:
    expected = expected_fields(qwen3_run)
    assert any(fields and "chat_template_kwargs" in fields for fields in expected.values())
    for record in iter_records(qwen3_run):
        stored = record["source_fields"]
        assert (json.loads(stored) if stored is not None else None) == expected[record["id"]], record["id"]


@pytest.mark.parametrize(
    "args",
    [
        ("--format", "speculators"),
        ("--format", "trl"),
        ("--format", "text"),
        ("--format", "text", "--last-turn-only"),
        ("--format", "conversations"),
        ("--format", "speculators", "--rows", "conversations"),
        ("--format", "trl", "--rows", "conversations"),
    ],
)
def test_every_format_carries_the_lines_other_fields(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """`source_fields`: the line's own fields, nested (a line's `sample` or `metadata` would collide with the
    row's), its chat_template_kwargs among them; null for a line with none; JSON text in trl's Parquet."""
    expected = expected_fields(qwen3_run)
    _, _, rows = export_cli(qwen3_run, tmp_path / "out", capsys, *args)
    assert rows
    for row in rows:
        fields = row["source_fields"]
        if args[1] == "trl":
            fields = json.loads(fields) if fields is not None else None
        assert fields == expected[row["id"]], row["id"]
    assert {row["id"] for row in rows if row["source_fields"] is not None} >= {
        row["id"] for row in rows if expected[row["id"]] is not None
    }
    assert any(row["sample"] == 0 and row["source_fields"] and "sample" in str(row["source_fields"]) for row in rows)


def test_an_output_stored_before_the_column_still_exports(
    qwen3_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    old = tmp_path / "old"
    shutil.copytree(qwen3_run, old)
    parquets = sorted((old / "data").glob("*.parquet"))
    assert parquets
    for path in parquets:
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["source_fields"]), path)
    for export_format in ("speculators", "trl", "conversations"):
        out = tmp_path / export_format
        args = ("--format", export_format, "--dataset", str(qwen3_run.parent / "chats.jsonl"))
        summary, _, rows = export_cli(old, out, capsys, *args)
        assert rows and all(row["source_fields"] is None for row in rows)
        assert summary["generated_tokens"] == generated_by_hand(qwen3_run)


def test_the_export_jobs_verdict_gives_each_formats_ratio(qwen3_run: Path, tmp_path: Path) -> None:
    """spec.export's Job (--formats): the Exported condition names each format's supervised / generated ratio."""
    from datagen_operator.api.outcome import StepOutcome

    out, log = tmp_path / "export", tmp_path / "termination-log"
    args = ["export", str(qwen3_run), "--formats", "speculators,trl", "--rows", "conversations", "--out", str(out)]
    assert datagen([*args, "--termination-log", str(log)]) == EXIT_OK
    outcome = StepOutcome.from_storage(log.read_text())
    for export_format in ("speculators", "trl"):
        ratio = read_export_manifest(out / export_format)["supervision"]["ratio"]
        assert ratio < 1 and f"supervised/generated {ratio:.2f}" in outcome.message.split(f"{export_format}: ")[1]


def test_a_lines_other_fields_are_every_key_but_its_conversation_and_id() -> None:
    from datagen_operator.prompts.lines import source_fields

    line = {
        "uuid": "u1", "id": 7, "conversations": [{"from": "human", "value": "hi"}], "messages": None,
        "tools": "[]", "system": "be brief", "chat_template_kwargs": {"reasoning_effort": "high"}, "extra": None,
    }  # fmt: skip
    # idField uuid: the line's `id` is one of its fields; a null value is kept; the line's order.
    assert json.loads(source_fields(line, "uuid") or "") == {
        "id": 7, "system": "be brief", "chat_template_kwargs": {"reasoning_effort": "high"}, "extra": None
    }  # fmt: skip
    assert list(json.loads(source_fields(line) or "")) == ["uuid", "system", "chat_template_kwargs", "extra"]
    assert source_fields({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) is None


def test_a_text_row_that_reencodes_to_other_ids_is_not_counted_supervised(qwen3_run: Path, tmp_path: Path) -> None:
    """A codec that loses the last id of every text of odd length: those rows' completions are `roundtrip_failed`."""
    from datagen_operator.export.exporter import export_output
    from datagen_operator.export.options import ExportOptions, TextCodec

    def encode(text: str) -> list[int]:
        ids = [int(piece) for piece in text.replace("<", " ").replace(">", " ").split()]
        return ids[:-1] if len(ids) % 2 else ids

    codec = TextCodec(decode=lambda ids: "".join(f"<{i}>" for i in ids), encode=encode, vocab_size=200_000)
    manifest = export_output(qwen3_run, tmp_path, ExportOptions("text"), codec)
    rows = read_rows(tmp_path)
    records = {(r["id"], r["sample"], r["turn"]): r for r in iter_records(qwen3_run)}
    failed = [records[(row["id"], row["sample"], row["turn"])] for row in rows if not row["roundtrip_ok"]]
    lost = sum(len(record["output_ids"]) for record in failed)
    assert failed and len(failed) < len(rows)
    assert manifest["supervision"]["unsupervised_tokens"] == {"roundtrip_failed": lost}
    assert manifest["supervision"]["supervised_tokens"] == generated_by_hand(qwen3_run) - lost
