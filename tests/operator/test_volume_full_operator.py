"""The operator with the run's output on a small real filesystem (tests/worker/volume.py's fixture, as the
output volume's hostPath): the worker that fills it exits 7, the Job does not retry it into the full volume,
and the run halts `Succeeded=False (OutputVolumeFull)` naming the output path and what to do."""

from __future__ import annotations

from pathlib import Path

from datagen_operator.api import parse_spec
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.preflight import estimate_for
from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, OperatorFactory, Runs, new_name
from tests.worker.volume import Volume, small_volume  # noqa: F401 (a size-limited filesystem)


def least_output(manifest: dict, data_dir: Path, volume: Path, tokenizer: Path) -> int:
    """The preflight's lower bound for this run, measured here on the same dataset and tokenizer."""
    spec = manifest["spec"]
    local = {
        **spec,
        "model": {"preset": "kimi-k2.5", "path": str(tokenizer)},
        "dataset": {"path": str(data_dir / "prompts.jsonl")},
        "output": {"path": str(volume / spec["output"]["path"])},
    }
    parsed = parse_spec(local)
    return estimate_for(parsed, load_tokenizer(tokenizer, trust_remote_code=False), tokenizer).lower


def test_a_full_output_volume_halts_the_run_naming_it(
    runs: Runs,
    operator: OperatorFactory,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
    small_volume: Volume,  # noqa: F811
) -> None:
    name = new_name("full")
    manifest = cluster_run(
        name,
        data_dir,
        standin_tokenizer,
        # One shard: a second that finishes first gives its reserve back and lets the other finish.
        **{"clients.shards": 1, "output.path": name, "output.volume": {"hostPath": {"path": str(small_volume.root)}}},
    )
    # Room for the least of the output (the preflight passes), not for the simulator's answers.
    small_volume.leave_free(least_output(manifest, data_dir, small_volume.root, standin_tokenizer) + 8 * 1024)
    with start_sim(*KIMI, tokenizer_dir=standin_tokenizer) as sim:
        operator([sim.url])
        runs.create(manifest)
        halted = runs.wait(name, "Succeeded", "False", "OutputVolumeFull", timeout=180)
    message = halted["message"]
    assert "bytes free after " in message and "grow the volume" in message, message
    assert f"{name} has " in message and "(shard 0 stopped)" in message, message  # the output path is named
    assert "Traceback" not in message
    workers = runs.job(f"{name}-workers")
    assert workers is not None and not workers.status.succeeded
    assert (workers.status.failed or 0) <= 1, "exit 7 is not retried into the full volume"
