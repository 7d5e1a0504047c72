"""`make test-consumers`: the consumers' own preprocessing on a real `datagen export` (opt-in: needs torch).

    python tests/export/consumers.py make-export DIR        # main venv: a store-built run, exported (speculators)
    CONSUMERS_PY tests/export/consumers.py speculators DIR   # consumers venv: speculators prepare-data on DIR/export

`speculators` runs `speculators prepare-data` exactly as docs/export.md says (the standin Kimi-format tokenizer
as --model), loads what it saved and checks each row's input_ids and loss_mask against the export, token for token.
Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SEQ_LENGTH = 4096
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.export.store_output


def make_export(directory: Path) -> None:
    from datagen_operator.export.run import ExportOptions, export_output
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
    from tests.export.store_output import build_output, random_records

    run = build_output(directory / "run", {0: random_records("a", 60, seed=7)}, compacted={0})
    manifest = export_output(run, directory / "export", ExportOptions("speculators"))
    (directory / "tokenizer.txt").write_text(str(ensure_standin_tokenizer()))
    print(f"exported {manifest['counts']['rows_written']} rows to {directory / 'export'}")


def check_speculators(directory: Path) -> None:
    from datasets import load_from_disk

    export, output = directory / "export", directory / "prepared"
    command = [
        str(Path(sys.executable).with_name("speculators")), "prepare-data",
        "--model", (directory / "tokenizer.txt").read_text(),
        "--data", str(export / "data"),
        "--output", str(output),
        "--seq-length", str(SEQ_LENGTH),
        "--overwrite",
    ]  # fmt: skip
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    prepared = load_from_disk(str(output))
    rows = [json.loads(line) for part in sorted((export / "data").glob("part-*.jsonl")) for line in part.open()]
    expected = {tuple(row["input_ids"]): row["loss_mask"] for row in rows}
    assert len(prepared) == len(rows), (len(prepared), len(rows))
    for item in prepared:
        ids = [int(t) for t in item["input_ids"]]
        assert tuple(ids) in expected, "a row's ids changed in preprocessing"
        assert [int(m) for m in item["loss_mask"]] == expected[tuple(ids)], "a loss mask changed"
    print(f"speculators prepare-data: {len(prepared)} rows, input_ids and loss_mask identical to the export")


if __name__ == "__main__":
    action, target = sys.argv[1], Path(sys.argv[2])
    {"make-export": make_export, "speculators": check_speculators}[action](target)
