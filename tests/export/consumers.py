"""`make test-consumers`: the consumers' own loaders on real `datagen export`s (opt-in: needs torch).

    python tests/export/consumers.py make-export DIR    # main venv: simulator runs of four families, every export
    CONSUMERS_PY tests/export/consumers.py check DIR     # consumers venv: SpecForge's and speculators' loaders

make-export regenerates small chat datasets (`generation.turns: all`) on the simulator for qwen3, kimi-k2.5,
deepseek-r1 and gpt-oss with their stand-in tokenizers, and writes, per family, every export docs/export.md offers
a consumer: `speculators` and `trl` per-turn rows, `speculators` whole-conversation rows, `conversations` and `text`; plus
the run's records (records.jsonl) to compare with.

check loads each export with the consumer's own code, exactly as docs/export.md says to:
- speculators (0.9.0): `speculators prepare-data` on the part files; what it saved is read back.
- SpecForge (0.2.0): `specforge.data.prompt_builder.prepare_prompt_tasks`, its online trainer's prompt loader: the
  pre-tokenized path for `speculators` rows; for `conversations` its raw path (`build_eagle3_dataset`, the
  family's registered chat template and parser), the file as exported and with `chat_template_kwargs` spread into
  columns as docs/export.md says.
- SpecForge `text` (`--is-preformatted`, the rows with `roundtrip_ok`), with and without `train_only_last_turn`.
- TRL: the `trl` parts through `datasets` (`input_ids`, `assistant_masks`).
and compares the (input_ids, loss_mask) each one will train on with the records (tests/export/trained.py): every
supervised token a generated token in its place; every generated token supervised exactly once. It prints a table
and writes DIR/consumers.json; it fails when a format docs/export.md recommends for a consumer and family
(RECOMMENDED) is not exactly 1.00 with nothing else supervised.
Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

MAX_LENGTH = 32768
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.export.*

FAMILIES = ("qwen3", "kimi-k2.5", "deepseek-r1", "gpt-oss")
SPECFORGE_TEMPLATE = {
    "qwen3": "qwen3-thinking",
    "kimi-k2.5": "kimi-k2-thinking",
    "deepseek-r1": "deepseek-r1-distill",
    "gpt-oss": "gpt-oss",
}
"""The SpecForge chat template (its TEMPLATE_REGISTRY name) a user picks for each family."""
EXPORTS = ("speculators-turns", "trl-turns", "speculators-conversations", "conversations", "text")
RECOMMENDED = {
    ("speculators", "speculators-turns"),
    ("specforge", "speculators-turns"),
    ("trl", "trl-turns"),
}
"""(consumer, export) pairs docs/export.md recommends for every family: each must train on every generated token
once, reasoning included, and on nothing else."""


def sim_flags(family: str) -> tuple[str, ...]:
    common = ("--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16", "--sim-length-sigma", "0.3")
    parsers = {
        "qwen3": ("--sim-family", "qwen3", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"),
        "kimi-k2.5": ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"),
        "deepseek-r1": ("--sim-family", "deepseek-r1", "--reasoning-parser", "deepseek-r1", "--tool-call-parser",
                        "deepseekv3"),
        "gpt-oss": ("--sim-family", "gpt-oss", "--reasoning-parser", "gpt-oss", "--tool-call-parser", "gpt-oss"),
    }  # fmt: skip
    # With sampling_seed 0 (make_export) under deterministic inference: the same output each time, as on SGLang.
    return (*parsers[family], *common, "--sim-seed", "11", "--enable-deterministic-inference")


def make_export(directory: Path) -> None:
    import orjson

    from datagen_operator.export.exporter import export_output
    from datagen_operator.export.options import DatasetSource, ExportOptions, codec_from_tokenizer
    from datagen_operator.output.readers import iter_records
    from datagen_operator.prompts.dataset_ref import DatasetRef
    from datagen_operator.prompts.render import load_tokenizer
    from datagen_operator.tokenizer.standin import ensure_standin
    from tests.export.test_export_conversations import chats, sim_run

    for family in FAMILIES:
        root = directory / family
        root.mkdir(parents=True)
        model = ensure_standin(family)
        items = chats(9, lambda i: 1 + i % 3)
        changes = {"model.preset": family, "model.path": str(model), "generation.sampling.sampling_seed": 0}
        output = sim_run(root, items, sim_flags(family), model, **changes)
        dataset = DatasetSource(DatasetRef(root / "chats.jsonl"))
        options = {
            "speculators-turns": ExportOptions("speculators"),
            "trl-turns": ExportOptions("trl"),
            "speculators-conversations": ExportOptions("speculators", rows="conversations", dataset=dataset),
            "conversations": ExportOptions("conversations", dataset=dataset),
        }
        for name, option in options.items():
            export_output(output, root / name, option)
        codec = codec_from_tokenizer(load_tokenizer(model, trust_remote_code=False))
        export_output(output, root / "text", ExportOptions("text"), codec)
        with (root / "records.jsonl").open("wb") as file:
            for record in iter_records(output):
                keep = {key: record[key] for key in ("id", "sample", "turn", "input_ids", "output_ids")}
                file.write(orjson.dumps(keep, option=orjson.OPT_APPEND_NEWLINE))
        (root / "tokenizer.txt").write_text(str(model))
        print(f"{family}: exported {', '.join(options)} to {root}", flush=True)


def parts(directory: Path, suffix: str = "jsonl") -> list[Path]:
    return sorted((directory / "data").glob(f"part-*.{suffix}"))


def one_file(export: Path, work: Path) -> Path:
    """The part files joined (SpecForge's prompts_path takes one file: docs/export.md)."""
    joined = work / f"{export.name}.jsonl"
    joined.write_bytes(b"".join(part.read_bytes() for part in parts(export)))
    return joined


def speculators_rows(export: Path, model: str, work: Path) -> list[tuple[list[int], list[int]]]:
    from datasets import load_from_disk

    output = work / f"prepared-{export.name}"
    command = [
        str(Path(sys.executable).with_name("speculators")), "prepare-data", "--model", model,
        "--data", str(export / "data"), "--output", str(output), "--seq-length", str(MAX_LENGTH), "--overwrite",
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prepared = load_from_disk(str(output))
    return [(list(item["input_ids"]), list(item["loss_mask"])) for item in prepared]


def specforge_rows(
    export: Path,
    tokenizer: Any,
    template: str,
    work: Path,
    *,
    spread_kwargs: bool = False,
    preformatted: bool = False,
    last_turn_only: bool = False,
) -> list[tuple[list[int], list[int]]]:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    path = one_file(export, work)
    if preformatted:  # docs/export.md: the rows whose text round-trips, as `--is-preformatted` text
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path = work / f"{export.name}-roundtrip.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows if row["roundtrip_ok"]))
    if spread_kwargs:  # docs/export.md: the row's chat_template_kwargs as columns, the nested field dropped
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            row.update(row.pop("chat_template_kwargs") or {})
        path = work / f"{export.name}-spread.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tasks = prepare_prompt_tasks(
        path, tokenizer, chat_template=template, max_length=MAX_LENGTH, is_preformatted=preformatted,
        train_only_last_turn=last_turn_only, cache_dir=None, cache_key=None, num_proc=1,
    )  # fmt: skip
    return [(task["payload"]["input_ids"], task["payload"]["loss_mask"]) for task in tasks]


def trl_rows(export: Path, work: Path) -> list[tuple[list[int], list[int]]]:
    from datasets import load_dataset

    files = [str(part) for part in parts(export, "parquet")]
    loaded = load_dataset("parquet", data_files=files, split="train", cache_dir=str(work / "hf"))
    return [(row["input_ids"], row["assistant_masks"]) for row in loaded]


def check(directory: Path) -> None:
    from transformers import AutoTokenizer

    from tests.export.trained import compare

    work = directory / "work"
    work.mkdir(exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    failures = []
    for family in FAMILIES:
        root = directory / family
        records = [json.loads(line) for line in (root / "records.jsonl").read_text().splitlines()]
        model = (root / "tokenizer.txt").read_text()
        tokenizer = AutoTokenizer.from_pretrained(model)
        template = SPECFORGE_TEMPLATE[family]
        loaders: dict[tuple[str, str], Callable[[], list[tuple[list[int], list[int]]]]] = {
            ("speculators", "speculators-turns"): partial(speculators_rows, root / "speculators-turns", model, work),
            ("speculators", "speculators-conversations"): partial(
                speculators_rows, root / "speculators-conversations", model, work
            ),
            ("specforge", "speculators-turns"): partial(
                specforge_rows, root / "speculators-turns", tokenizer, template, work
            ),
            ("specforge", "speculators-conversations"): partial(
                specforge_rows, root / "speculators-conversations", tokenizer, template, work
            ),
            ("specforge", "conversations"): partial(specforge_rows, root / "conversations", tokenizer, template, work),
            ("specforge", "conversations+kwargs"): partial(
                specforge_rows, root / "conversations", tokenizer, template, work, spread_kwargs=True
            ),
            ("specforge", "text"): partial(specforge_rows, root / "text", tokenizer, template, work, preformatted=True),
            ("specforge", "text+train_only_last_turn"): partial(
                specforge_rows, root / "text", tokenizer, template, work, preformatted=True, last_turn_only=True
            ),
            ("trl", "trl-turns"): partial(trl_rows, root / "trl-turns", work),
        }
        for (consumer, export), load in loaders.items():
            key = f"{family} {consumer} {export}"
            try:
                trained = compare(load(), records)
            except Exception as error:  # what the loader did is the finding: reported, not hidden
                results[key] = {"error": f"{type(error).__name__}: {error}"}
                print(f"{key}: {type(error).__name__}: {error}", flush=True)
                traceback.print_exc(limit=-2)
                if (consumer, export) in RECOMMENDED:
                    failures.append(key)
                continue
            results[key] = trained.to_json()
            print(f"{key}: {trained.summary()}", flush=True)
            if (consumer, export) in RECOMMENDED and (trained.ratio != 1.0 or trained.not_generated):
                failures.append(key)
    (directory / "consumers.json").write_text(json.dumps(results, indent=1))
    print("\nfamily       consumer     export                       supervised/generated  not generated  exactly once")
    for key, result in results.items():
        family, consumer, export = key.split(" ")
        if "error" in result:
            print(f"{family:12} {consumer:12} {export:28} {result['error'][:70]}")
            continue
        ratio = result["supervised_in_place"] / result["generated"]
        print(
            f"{family:12} {consumer:12} {export:28} {ratio:20.2f}  {result['not_generated']:13}  {result['ratio']:.2f}"
        )
    if failures:
        raise SystemExit(f"recommended formats that do not train on exactly what the model wrote: {failures}")
    print("\nevery recommended format trains on every generated token once, and on nothing else")


if __name__ == "__main__":
    action, target = sys.argv[1], Path(sys.argv[2])
    {"make-export": make_export, "check": check}[action](target)
