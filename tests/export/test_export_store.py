"""`export_output` over outputs written with the store's own writer: exactly once, byte-exact, bounded
parts, manifest, token frequency, the consumers' loaders, and one test per pitfall of the issue."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED_VERDICT, EXIT_OK
from datagen_operator.export.exporter import export_output
from datagen_operator.export.formats import IGNORE_INDEX, Selection
from datagen_operator.export.manifest import read_export_manifest
from datagen_operator.export.options import ExportOptions, TextCodec
from datagen_operator.export.run import main
from datagen_operator.output.layout import OutputLayout, sha256_file
from datagen_operator.output.readers import iter_records
from tests.export.store_output import FINGERPRINT, STOP, build_output, make_record, random_records

Key = tuple[str, int]


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shard 0 compacted; shard 1 compacted with its segments left behind (crash before removal: the same
    records twice on disk); shard 2 never compacted (an unfinished run), with a torn last line."""
    root = tmp_path_factory.mktemp("run") / "out"
    shards = {
        0: random_records("a", 40, seed=0),
        1: random_records("b", 30, seed=1),
        2: random_records("c", 25, seed=2),
    }
    build_output(root, shards, compacted={0, 1}, leftover_segments={1})
    segment = OutputLayout(root).segments(2)[-1]
    with segment.open("ab") as file:
        file.write(b'{"id": "torn", "sample": 0, "input_ids": [1, 2')
    return root


def stored(root: Path) -> dict[Key, dict[str, Any]]:
    """The store's own reader is the oracle."""
    return {(r["id"], r["sample"]): r for r in iter_records(root)}


def read_jsonl_rows(out: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for part in sorted((out / "data").glob("part-*.jsonl"))
        for line in part.read_bytes().splitlines()
    ]


def read_trl_rows(out: Path) -> list[dict[str, Any]]:
    return [row for part in sorted((out / "data").glob("part-*.parquet")) for row in pq.read_table(part).to_pylist()]


def export(root: Path, out: Path, export_format: str, **options: Any) -> dict[str, Any]:
    selection, codec = options.pop("selection", Selection()), options.pop("codec", None)
    return export_output(root, out, ExportOptions(export_format, selection=selection, **options), codec)


def keyed(rows: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    counts = Counter((row["id"], row["sample"]) for row in rows)
    assert [key for key, n in counts.items() if n > 1] == []
    return {(row["id"], row["sample"]): row for row in rows}


@pytest.mark.parametrize("export_format", ["speculators", "trl"])
def test_every_record_exactly_once_with_byte_exact_ids(run_output: Path, tmp_path: Path, export_format: str) -> None:
    manifest = export(run_output, tmp_path, export_format)
    rows = read_jsonl_rows(tmp_path) if export_format == "speculators" else read_trl_rows(tmp_path)
    expected = stored(run_output)
    assert len(expected) == 95
    by_key = keyed(rows)
    assert set(by_key) == set(expected)
    for key, record in expected.items():
        row = by_key[key]
        assert row["input_ids"] == record["input_ids"] + record["output_ids"]
        mask = row["loss_mask"] if export_format == "speculators" else row["assistant_masks"]
        assert mask == [0] * len(record["input_ids"]) + [1] * len(record["output_ids"])
        meta = row["metadata"] if export_format == "speculators" else row
        assert meta["finish_reason"] == record["finish_reason"]["type"]
        assert meta["flags"] == record["flags"]
        assert meta["unfinished"] is key[0].startswith("c")  # shard 2's segments, marked
        if export_format == "trl":
            assert row["labels"] == [IGNORE_INDEX] * len(record["input_ids"]) + record["output_ids"]
    counts = manifest["counts"]
    assert counts["records_read"] == counts["rows_written"] == 95 and counts["rows_unfinished"] == 25
    assert counts["tokens_written"] == sum(len(r["input_ids"]) + len(r["output_ids"]) for r in expected.values())


def test_manifest_names_the_source_and_every_part(run_output: Path, tmp_path: Path) -> None:
    export(run_output, tmp_path, "speculators")
    manifest = read_export_manifest(tmp_path)
    assert manifest["source"]["fingerprint_sha256"] == FINGERPRINT
    assert manifest["source"]["complete"] is False  # shard 2 is still running
    assert manifest["lossy"] is False and manifest["left_out"] == {}
    for part in manifest["parts"]:
        path = tmp_path / part["name"]
        assert part["sha256"] == sha256_file(path) and part["bytes"] == path.stat().st_size
        assert part["rows"] == len(path.read_bytes().splitlines())
    assert sum(part["rows"] for part in manifest["parts"]) == 95


def test_token_frequency_counts_the_supervised_tokens(run_output: Path, tmp_path: Path) -> None:
    export(run_output, tmp_path, "trl", selection=Selection(exclude_flags=frozenset({"truncated"})))
    kept = [r for r in stored(run_output).values() if r["finish_reason"]["type"] == "stop"]
    expected = np.bincount(np.concatenate([r["output_ids"] for r in kept]))
    counts = np.load(tmp_path / "token_freq.npy")
    assert np.array_equal(counts[: len(expected)], expected) and counts[len(expected) :].sum() == 0
    document = orjson.loads((tmp_path / "token_freq.json").read_bytes())
    assert document["counts"][str(STOP)] == len(kept) == expected[STOP]
    assert document["total"] == sum(len(r["output_ids"]) for r in kept)


@pytest.mark.parametrize("export_format", ["speculators", "trl"])
def test_parts_stay_bounded(run_output: Path, tmp_path: Path, export_format: str) -> None:
    batch_tokens, part_bytes = 600, 6000
    manifest = export(run_output, tmp_path, export_format, part_bytes=part_bytes, batch_tokens=batch_tokens)
    parts = manifest["parts"]
    assert len(parts) > 3
    # A part closes at the first batch that takes it past the bound: at most one batch over.
    largest_batch = 12_000 if export_format == "speculators" else 40_000  # ~740 tokens: 9 bytes each + row heads
    assert all(part["bytes"] < part_bytes + largest_batch for part in parts)
    assert sum(part["rows"] for part in parts) == 95
    assert sorted(f"data/{p.name}" for p in (tmp_path / "data").glob("part-*")) == [part["name"] for part in parts]
    assert not list((tmp_path / "data").glob(".part-*"))  # no temporaries left


def test_datasets_loads_both_formats(run_output: Path, tmp_path: Path) -> None:
    import datasets

    export(run_output, tmp_path / "spec", "speculators")
    export(run_output, tmp_path / "trl", "trl")
    cache = str(tmp_path / "hf")
    jsonl = datasets.load_dataset(
        "json", data_files=str(tmp_path / "spec" / "data" / "part-*.jsonl"), split="train", cache_dir=cache
    )
    table = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "trl" / "data" / "part-*.parquet"), split="train", cache_dir=cache
    )
    expected = stored(run_output)
    for loaded, mask in ((jsonl, "loss_mask"), (table, "assistant_masks")):
        assert loaded.num_rows == 95
        for row in loaded:
            record = expected[(row["id"], row["sample"])]
            assert row["input_ids"] == record["input_ids"] + record["output_ids"]
            assert sum(row[mask]) == len(record["output_ids"])
    assert {"input_ids", "assistant_masks", "labels"} <= set(table.column_names)
    # speculators' prepare-data given a directory loads every *.json and *.jsonl under it: only parts.
    directory = tmp_path / "spec" / "data"
    as_speculators = sorted(str(p) for p in (*directory.rglob("*.json"), *directory.rglob("*.jsonl")))
    assert datasets.load_dataset("json", data_files=as_speculators, split="train", cache_dir=cache).num_rows == 95


# --- pitfalls ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_and_short(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("long") / "out"
    records = [
        make_record("short", 0, [1, 2, 3], [10, STOP]),
        make_record("long", 0, [1, 2, 3], [*range(20, 40), STOP]),  # 24 tokens: the stop token is the 24th
        make_record("cut", 0, [1, 2, 3], list(range(50, 60)), finish="length"),
        make_record("cut_unflagged", 0, [4], [61, 62], finish="length", flags=[]),
    ]
    return build_output(root, {0: records}, compacted={0})


def test_over_length_rows_are_dropped_not_cut(long_and_short: Path, tmp_path: Path) -> None:
    # A trainer truncating at 16 would keep the start and lose the answer's end and its stop token.
    manifest = export(long_and_short, tmp_path, "speculators", selection=Selection(max_length=16))
    rows = keyed(read_jsonl_rows(tmp_path))
    assert "long" not in rows and manifest["left_out"] == {"over_length": 1}
    assert manifest["left_out_examples"] == {"over_length": ["long#0"]}
    assert all(len(row["input_ids"]) <= 16 for row in rows.values())


def test_over_length_rows_kept_whole_and_flagged(long_and_short: Path, tmp_path: Path) -> None:
    manifest = export(
        long_and_short, tmp_path, "speculators", selection=Selection(max_length=16, over_length="keep-flagged")
    )
    row = keyed(read_jsonl_rows(tmp_path))[("long", 0)]
    assert len(row["input_ids"]) == 24 and row["input_ids"][-1] == STOP and row["loss_mask"][-1] == 1
    assert row["metadata"]["over_length"] is True
    assert manifest["counts"]["rows_over_length_kept"] == 1 and manifest["left_out"] == {}


def test_length_rows_have_no_stop_token_and_say_so(long_and_short: Path, tmp_path: Path) -> None:
    export(long_and_short, tmp_path, "speculators")
    rows = keyed(read_jsonl_rows(tmp_path))
    for key in ("cut", "cut_unflagged"):
        row = rows[(key, 0)]
        assert row["input_ids"][-1] != STOP and row["metadata"]["finish_reason"] == "length"
    assert rows[("cut", 0)]["metadata"]["flags"] == ["truncated"]
    assert rows[("short", 0)]["input_ids"][-1] == STOP and rows[("short", 0)]["loss_mask"][-1] == 1


def test_exclude_truncated_leaves_out_every_length_row(long_and_short: Path, tmp_path: Path) -> None:
    manifest = export(long_and_short, tmp_path, "trl", selection=Selection(exclude_flags=frozenset({"truncated"})))
    assert set(keyed(read_trl_rows(tmp_path))) == {("short", 0), ("long", 0)}
    # Even the row whose stored flags miss `truncated`: it ended on `length`, so it has no stop token.
    assert manifest["left_out"] == {"flag:truncated": 2}


def test_multi_turn_prompt_is_whole_and_only_the_generated_turn_is_supervised(tmp_path: Path) -> None:
    # Prompt: user, assistant (an earlier turn from the dataset), user, then the generation prompt.
    multi_turn = [900, 1, 2, 901, 3, 4, STOP, 900, 5, 901]
    root = build_output(tmp_path / "out", {0: [make_record("mt", 0, multi_turn, [7, 8, STOP])]}, compacted={0})
    export(root, tmp_path / "spec", "speculators")
    (row,) = read_jsonl_rows(tmp_path / "spec")
    assert row["input_ids"][: len(multi_turn)] == multi_turn  # never trimmed
    assert row["loss_mask"] == [0] * len(multi_turn) + [1, 1, 1]  # the earlier assistant turn is not supervised
    codec = TextCodec(decode=lambda t: "".join(f"<{i}>" for i in t), encode=_angle_encode, vocab_size=None)
    manifest = export(root, tmp_path / "text", "text", codec=codec, last_turn_only=True)
    (text,) = read_jsonl_rows(tmp_path / "text")
    assert text["completion"] == f"<7><8><{STOP}>" and text["roundtrip_ok"] is True
    assert manifest["lossy"] is True and manifest["options"]["last_turn_only_applies"] is True


def _angle_encode(text: str) -> list[int]:
    return [int(piece) for piece in text.replace("<", " ").replace(">", " ").split()]


def test_text_counts_failed_roundtrips(run_output: Path, tmp_path: Path) -> None:
    lossy = TextCodec(
        decode=lambda t: "".join(f"<{i}>" for i in t), encode=lambda s: _angle_encode(s)[:5], vocab_size=VOCAB_PLUS
    )
    manifest = export(run_output, tmp_path, "text", codec=lossy)
    rows = read_jsonl_rows(tmp_path)
    assert len(rows) == 95 and all("text" in row for row in rows)
    assert manifest["counts"]["roundtrip_failed"] == sum(not row["roundtrip_ok"] for row in rows) > 0
    assert manifest["token_freq"]["vocab_size"] == VOCAB_PLUS


VOCAB_PLUS = 200_000


# --- command line -----------------------------------------------------------------------------------


def test_cli_refuses_bad_input(run_output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    refused = main([str(run_output), "--format", "speculators", "--out", str(out), "--exclude-flags", "truncate"])
    assert refused == EXIT_BAD_INPUT
    assert "unknown truncate" in capsys.readouterr().err
    # A store with an unfinished shard and no run.yaml cannot pass verification: exported only when asked.
    assert main([str(run_output), "--format", "speculators", "--out", str(out)]) == EXIT_FAILED_VERDICT
    assert "--allow-unverified" in capsys.readouterr().err and not out.exists()
    assert main([str(run_output), "--format", "speculators", "--out", str(out), "--allow-unverified"]) == EXIT_OK
    assert main([str(run_output), "--format", "speculators", "--out", str(out)]) == EXIT_BAD_INPUT  # an export is there
    assert "--overwrite" in capsys.readouterr().err
    assert main([str(run_output), "--format", "trl", "--out", str(out), "--overwrite", "--allow-unverified"]) == EXIT_OK
    assert not list((out / "data").glob("part-*.jsonl")) and list((out / "data").glob("part-*.parquet"))
    no_tokenizer = main([str(run_output), "--format", "text", "--out", str(tmp_path / "t")])  # nor run.yaml
    assert no_tokenizer == EXIT_BAD_INPUT
    assert "--tokenizer" in capsys.readouterr().err


def test_both_command_lines_refuse_a_misspelled_flag(
    run_output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--format and --formats (the export Job) read --exclude-flags one way: a typo is refused, never ignored."""
    from datagen_operator.api.outcome import StepOutcome

    out, log = tmp_path / "export", tmp_path / "termination-log"
    typo = ["--exclude-flags", "truncated,truncted", "--allow-unverified"]
    assert main([str(run_output), "--format", "trl", "--out", str(out), *typo]) == EXIT_BAD_INPUT
    assert "--exclude-flags: unknown truncted; known: token_count_mismatch," in capsys.readouterr().err
    args = [str(run_output), "--formats", "trl", "--out", str(out), "--termination-log", str(log)]
    assert main([*args, "--exclude-flags", "truncated,truncted"]) == EXIT_FAILED_VERDICT
    outcome = StepOutcome.from_storage(log.read_text())
    assert not outcome.passed and outcome.reason == "ExportFailed"
    assert "--exclude-flags: unknown truncted; known: token_count_mismatch," in outcome.message
    assert not out.exists()


def test_cli_formats_writes_the_export_jobs_verdict(run_output: Path, tmp_path: Path) -> None:
    """--formats (the export Job of spec.export): each format in OUT/<format>, rerunnable, and the
    verdict as a StepOutcome in --termination-log; a failure is a verdict too (EXIT_FAILED_VERDICT)."""
    from datagen_operator.api.outcome import StepOutcome

    out, log = tmp_path / "export", tmp_path / "termination-log"
    for _ in range(2):  # a rerun (the Job's retry) replaces the first export
        args = [str(run_output), "--formats", "speculators,trl", "--out", str(out), "--termination-log", str(log)]
        assert main([*args, "--exclude-flags", "truncated"]) == EXIT_OK
        outcome = StepOutcome.from_storage(log.read_text())
        assert outcome.passed and outcome.reason == "Exported" and "speculators: " in outcome.message
        assert read_export_manifest(out / "trl")["counts"] == read_export_manifest(out / "speculators")["counts"]
    args = [str(run_output), "--formats", "text", "--out", str(out), "--termination-log", str(log)]
    assert main(args) == EXIT_FAILED_VERDICT  # no run.yaml, no tokenizer
    outcome = StepOutcome.from_storage(log.read_text())
    assert not outcome.passed and outcome.reason == "ExportFailed" and "--tokenizer" in outcome.message
