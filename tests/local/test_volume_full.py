"""`datagen run` with its output on a small real filesystem (tests/worker/volume.py): the preflight refuses
a volume that cannot hold even the least of the output and warns about one that may fill; a volume that
fills mid-run halts the run with the cause in its condition, and the same command resumes once it grows."""

from __future__ import annotations

from pathlib import Path

import yaml

from datagen_operator.api import parse_run
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.preflight import estimate_for, run_preflight, stored_bytes
from tests.local.runs import FAST_SIM, datagen_run, manifest, stored_keys
from tests.worker.simrun import prompts, standin, write_dataset
from tests.worker.volume import Volume


def run_file(tmp_path: Path, output: Path, count: int = 300, shards: int = 2) -> Path:
    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(count))
    return manifest(tmp_path, standin(), dataset=dataset, output=output, **{"clients.shards": shards})


def preflight(path: Path):
    spec = parse_run(yaml.safe_load(path.read_text())).spec
    tokenizer = load_tokenizer(standin(), trust_remote_code=False)
    estimate = estimate_for(spec, tokenizer, standin())
    outcome = run_preflight(spec, tokenizer, standin(), Path(spec.dataset.path), Path(spec.output.path))
    return estimate, outcome


def test_preflight_refuses_a_volume_too_small_for_the_least_output_and_warns_below_the_most(
    tmp_path: Path, small_volume: Volume
) -> None:
    path = run_file(tmp_path, small_volume.root / "out")
    estimate, _ = preflight(path)
    # Measured, not guessed: short prompts (~20 tokens) of a few bytes a token, both reserves.
    assert 2 * 256 * 1024 < estimate.lower < estimate.upper
    assert 2.0 < estimate.bytes_per_output_token < 12.0

    # The rendered store of the first preflight is on the volume: it is replaced, so its bytes are room too.
    stored = stored_bytes(small_volume.root / "out")
    small_volume.leave_free(estimate.lower - 32 * 1024 - stored)
    _, outcome = preflight(path)
    assert not outcome.passed and outcome.reason == "OutputVolumeTooSmall"
    assert "free; the output needs at least" in outcome.message and "grow the volume" in outcome.message

    # The refused preflight abandoned its store: nothing of it is on the volume to give back now (subtracting its
    # bytes here left about 4 KiB of the 64, which the new store's page rounding could take).
    assert stored_bytes(small_volume.root / "out") == 0
    small_volume.leave_free(estimate.lower + 64 * 1024)
    _, outcome = preflight(path)
    assert outcome.passed and "warning: " in outcome.message and "may fill up" in outcome.message

    small_volume.grow()
    small_volume.leave_free(estimate.upper + 64 * 1024 - stored)
    _, outcome = preflight(path)
    assert outcome.passed and "warning" not in outcome.message


def conversations(count: int, turns: int) -> list[dict[str, object]]:
    """`count` conversations of `turns` user turns, each answered by the dataset but the last; the first user
    turn is the same whatever `turns` is, so every conversation's first request renders alike."""
    lines: list[dict[str, object]] = []
    for i in range(count):
        messages = []
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Question {i}, part {turn}?"})
            if turn < turns - 1:
                messages.append({"role": "assistant", "content": f"Answer {i}, part {turn}."})
        lines.append({"id": f"c{i:04d}", "messages": messages})
    return lines


def test_the_room_estimate_counts_every_turn_of_whole_conversations_and_refuses_a_volume_too_small(
    tmp_path: Path, small_volume: Volume
) -> None:
    """Bug 1 (issue 48): with generation.turns all the run writes a record per planned turn, as the plan counts
    them: a five-turn dataset needs about five times the room of a one-turn one, and a volume that holds the
    one-turn run's least but not the five-turn run's is refused."""
    estimates = {}
    for turns in (1, 5):
        folder = tmp_path / f"turns-{turns}"
        folder.mkdir()
        dataset = write_dataset(folder / "prompts.jsonl", conversations(300, turns))
        output = small_volume.root / f"out-{turns}"
        path = manifest(
            folder, standin(), dataset=dataset, output=output, **{"generation.turns": "all", "clients.shards": 1}
        )
        estimates[turns], _ = preflight(path)
    one, five = estimates[1], estimates[5]
    assert (one.records, five.records) == (300, 5 * 300)
    assert 4.5 < five.upper / one.upper <= 5.0

    stored = stored_bytes(small_volume.root / "out-5")
    free = five.lower - 32 * 1024 - stored
    assert free > one.lower + 64 * 1024  # room for the one-turn run's least: only the turns refuse it
    small_volume.leave_free(free)
    _, outcome = preflight(path)
    assert not outcome.passed and outcome.reason == "OutputVolumeTooSmall", outcome.message
    assert "1500 records x" in outcome.message


def test_a_volume_that_fills_mid_run_names_itself_then_the_same_command_resumes(
    tmp_path: Path, small_volume: Volume
) -> None:
    output = small_volume.root / "out"
    # One shard: with two, one that finishes first (a busy machine starts the other late) frees its
    # reserve and lets the other finish: no full volume to see.
    path = run_file(tmp_path, output, shards=1)
    estimate, _ = preflight(path)
    # Passes the preflight (room for the least, after run.yaml and the lease the runner writes first: a block
    # each), cannot hold the ~80-token answers the simulator gives.
    small_volume.leave_free(estimate.lower + 16 * 1024)

    result = datagen_run(path, *FAST_SIM)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "InputsVerified=True" in text and "warning: " in text
    assert "Succeeded=False (OutputVolumeFull)" in text, text[-4000:]
    assert f"{output} has " in text and "bytes free after " in text and "grow the volume" in text
    assert f"{output} has {256 * 1024} bytes free" not in text  # measured before the reserve is given back
    assert "Traceback" not in text

    small_volume.grow()
    result = datagen_run(path, *FAST_SIM)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Succeeded=True" in result.stdout
    keys = stored_keys(output)
    assert sorted(keys) == sorted((f"p{i:04d}", 0) for i in range(300))  # each exactly once
    assert not [p for p in small_volume.root.rglob("*") if p.name.endswith(".tmp") or p.name == ".reserve"]
