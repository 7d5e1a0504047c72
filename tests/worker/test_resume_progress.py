"""A resumed worker's first snapshot counts the whole output: its records, the server's refusals and the samples
of prompts set aside by an earlier run, before it has read a line of the dataset again. The operator and
`datagen run` add these up as the run's progress, which then never goes backwards across a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.worker.progress import FileSink
from tests.harness.sim import start_sim
from tests.worker.simrun import SIM_FLAGS, progress, prompts, run_inprocess, spec, standin, write_dataset


def settled(snapshot: dict[str, Any]) -> int:
    """Samples with nothing left to do, as the operator sums them (control/progress.progress_of)."""
    return int(snapshot["records_done"] + snapshot["records_rejected"] + snapshot["records_set_aside"])


def test_a_resumed_workers_first_snapshot_counts_what_the_output_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = prompts(8, tools_every=0)
    items[3]["messages"][-1]["content"] = "a long question " * 40  # over the 600-token context: set aside
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"generation.samplesPerPrompt": 2, "generation.sampling.max_new_tokens": 512})
    with start_sim(*SIM_FLAGS, "--context-length", "600", tokenizer_dir=standin()) as sim:
        assert run_inprocess(document, [sim.url]) == EXIT_OK
        finished = progress(output)
        assert settled(finished) == 16 and finished["records_set_aside"] == 2

        published: list[dict[str, Any]] = []
        write = FileSink.write

        def recording(self: FileSink, snapshot: Any) -> None:
            published.append(orjson.loads(snapshot.for_storage()))
            write(self, snapshot)

        monkeypatch.setattr(FileSink, "write", recording)
        assert run_inprocess(document, [sim.url]) == EXIT_OK
    first = published[0]
    assert first["prompts_total"] == 0, "the first snapshot goes out before the dataset is read"
    assert settled(first) == 16, first
    assert [settled(s) for s in published] == [16] * len(published)
