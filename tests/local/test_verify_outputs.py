"""`datagen verify` and `datagen export` on what a user points them at: a halted run's output and a folder that
is no output say so in one line; a cluster output's run.yaml (paths on its volumes, as the pods see them) is
read from where the output lies on this machine; export refuses an output that fails verification unless
asked."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
import yaml

from datagen_operator.api.paths import POD_MOUNTS
from datagen_operator.cli import main as datagen
from tests.local.runs import FAST_SIM, PROMPTS, datagen_run, manifest
from tests.manifests import DELETE, changed


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, standin_tokenizer: Path) -> Path:
    root = tmp_path_factory.mktemp("finished")
    result = datagen_run(manifest(root, standin_tokenizer), *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "out"


@pytest.fixture(scope="module")
def halted(tmp_path_factory: pytest.TempPathFactory, standin_tokenizer: Path) -> Path:
    """The seeds' mistake: the wrong reasoning parser halts the run before its workers."""
    root = tmp_path_factory.mktemp("halted")
    # As examples/misconfigured.yaml writes it: no preset (which would refuse the parser), trust remote code.
    run_file = manifest(
        root,
        standin_tokenizer,
        **{
            "model.preset": DELETE,
            "model.trustRemoteCode": True,
            "server.reasoningParser": "kimi",
            "server.toolCallParser": "kimi_k2",
        },
    )
    result = datagen_run(run_file)
    assert result.returncode == 1 and "ParsersMismatch" in result.stdout, result.stdout + result.stderr
    return root / "out"


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_verify_of_a_halted_output_says_so_in_one_line(halted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert datagen(["verify", str(halted)]) == 1
    out = lines(capsys.readouterr().out)
    assert len(out) == 1, out
    assert out[0].startswith(f"{halted}: the output of DataGenRun t, with no record in it")
    assert "FAIL" not in out[0] and "missing" not in out[0] and "manifest.json" not in out[0]


def test_export_of_a_halted_output_writes_nothing(
    halted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    assert datagen(["export", str(halted), "--format", "speculators", "--out", str(out)]) == 2
    err = lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("error: nothing to export: ") and "no record" in err[0], err
    assert not out.exists()


def test_a_folder_that_is_no_output_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("not a run\n")
    assert datagen(["verify", str(tmp_path)]) == 2
    out = lines(capsys.readouterr().out)
    assert out == [f"{tmp_path}: not a datagen output: no manifest.json, run.yaml, shards/ or data/ in it "
                   "(a run writes them in its spec.output.path)"]  # fmt: skip
    assert datagen(["export", str(tmp_path), "--format", "trl", "--out", str(tmp_path / "x")]) == 2
    assert "not a datagen output" in capsys.readouterr().err


def test_verify_of_the_folder_above_outputs_names_them(
    finished: Path, halted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for output in (finished, halted):
        shutil.copytree(output, tmp_path / output.parent.name)
    assert datagen(["verify", str(tmp_path)]) == 2
    out = lines(capsys.readouterr().out)
    assert len(out) == 1 and out[0].endswith(f"; the outputs in it: {finished.parent.name}, {halted.parent.name}")


def as_cluster_output(finished: Path, volume: Path, *, dataset_path: str, output_path: str) -> Path:
    """The finished output where a cluster run on one `data` claim leaves it, seen from a machine that mounts
    the claim at `volume`: the dataset and the output on it, run.yaml the applied manifest (pod paths)."""
    output = volume / output_path
    shutil.copytree(finished, output)
    inside = dataset_path.removeprefix(POD_MOUNTS[0]).lstrip("/")
    (volume / inside).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROMPTS, volume / inside)
    claim = {"persistentVolumeClaim": {"claimName": "data"}}
    run = changed(
        yaml.safe_load((output / "run.yaml").read_text()),
        {
            "spec.model.path": "/models/kimi-k2.5",  # where the pods mount it
            "spec.dataset.path": dataset_path,
            "spec.dataset.volume": claim,
            "spec.output.path": output_path,
            "spec.output.volume": claim,
        },
    )
    (output / "run.yaml").write_text(yaml.safe_dump(run))
    return output


@pytest.mark.parametrize(
    "dataset_path", ["prompts/b1.jsonl", f"{POD_MOUNTS[0]}/prompts/b1.jsonl"], ids=["on-the-volume", "pod-mount"]
)
def test_verify_finds_a_cluster_outputs_dataset_on_its_volume(
    finished: Path, standin_tokenizer: Path, tmp_path: Path, dataset_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    output = as_cluster_output(finished, tmp_path / "data", dataset_path=dataset_path, output_path="eagle3/b1")
    assert datagen(["verify", str(output), "--tokenizer", str(standin_tokenizer), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    fidelity = next(check for check in report["checks"] if check["name"] == "prompt_fidelity")
    assert fidelity["passed"] and fidelity["total"] > 0, fidelity


def test_verify_of_a_cluster_output_names_the_pod_only_model_path(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = as_cluster_output(finished, tmp_path / "data", dataset_path="prompts/b1.jsonl", output_path="runs/b1")
    assert datagen(["verify", str(output)]) == 1  # no tokenizer here: prompts cannot be re-rendered
    out = capsys.readouterr().out
    assert "note: spec.model.path /models/kimi-k2.5 is not a directory here: pass --tokenizer DIR" in out


def test_export_refuses_an_output_that_fails_verification_unless_asked(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out"
    shutil.copytree(finished, output)
    manifest_file = output / "manifest.json"
    manifest = orjson.loads(manifest_file.read_bytes())
    shard = next(iter(manifest["shards"].values()))
    shard["parquet_sha256"] = "0" * 64  # a shard that is not what was written
    manifest_file.write_bytes(orjson.dumps(manifest))
    export = tmp_path / "export"
    assert datagen(["export", str(output), "--format", "speculators", "--out", str(export)]) == 1
    err = lines(capsys.readouterr().err)
    assert len(err) == 1 and "fails verification: integrity" in err[0] and "--allow-unverified" in err[0], err
    assert not export.exists()
    assert datagen(["export", str(output), "--format", "speculators", "--out", str(export), "--allow-unverified"]) == 0
    assert orjson.loads(capsys.readouterr().out)["rows_written"] == manifest["counts"]["records"]


def test_export_of_a_verified_output_goes_ahead(finished: Path, tmp_path: Path) -> None:
    assert datagen(["export", str(finished), "--format", "trl", "--out", str(tmp_path / "export")]) == 0
