"""`datagen run` reads only what the manifest names on this machine: a missing model directory is refused unless
the user asks for a stand-in (`--standin`), and a volume it cannot mount is refused naming the field."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from datagen_operator.api import load_run
from datagen_operator.api.errors import SpecError
from datagen_operator.api.exit_codes import EXIT_STEP_CRASHED
from datagen_operator.api.paths import run_on_this_machine
from tests.local.runs import (
    FAST_SIM,
    PROMPTS,
    datagen_run,
    held,
    manifest,
    start_generating,
    stored_keys,
)
from tests.manifests import DELETE


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def test_a_missing_model_path_is_refused_and_nothing_is_created(tmp_path: Path, standin_tokenizer: Path) -> None:
    missing = tmp_path / "models" / "does-not-exist"
    result = datagen_run(manifest(tmp_path, standin_tokenizer, **{"model.path": str(missing)}), *FAST_SIM)
    assert result.returncode == 2, result.stdout + result.stderr
    said = flat(result.stdout)
    assert f"spec.model.path: {missing} does not exist on this machine" in said
    assert "pass --standin" in said
    assert not missing.exists() and not (tmp_path / "models").exists(), "no stand-in may be built unasked"
    assert not (tmp_path / "out").exists(), "nothing may be started"


def test_standin_builds_the_presets_tokenizer_where_asked_and_the_run_succeeds(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    model = tmp_path / "models" / "qwen3"
    run_file = manifest(tmp_path, standin_tokenizer, **{"model.path": str(model), "model.preset": "qwen3"})
    result = datagen_run(run_file, "--standin", *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--standin: building the qwen3 stand-in tokenizer at" in flat(result.stdout)
    assert (model / "tokenizer_config.json").exists()
    assert len(stored_keys(tmp_path / "out")) == len([line for line in PROMPTS.read_text().splitlines() if line])


def test_standin_without_a_preset_is_refused_naming_the_field(tmp_path: Path, standin_tokenizer: Path) -> None:
    missing = tmp_path / "nowhere"
    run_file = manifest(
        tmp_path,
        standin_tokenizer,
        **{
            "model.path": str(missing),
            "model.preset": DELETE,
            "server.reasoningParser": "kimi_k2",
            "server.toolCallParser": "kimi_k2",
        },
    )
    result = datagen_run(run_file, "--standin", *FAST_SIM)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "spec.model.preset is not set" in flat(result.stdout)
    assert not missing.exists()


@pytest.mark.parametrize(
    ("section", "volume", "named"),
    [
        ("model", {"persistentVolumeClaim": {"claimName": "models"}}, "a persistentVolumeClaim (models)"),
        ("dataset", {"persistentVolumeClaim": {"claimName": "data"}}, "a persistentVolumeClaim (data)"),
        ("output", {"nfs": {"server": "nfs.local", "path": "/export"}}, "an NFS export (nfs.local:/export)"),
    ],
)
def test_a_volume_datagen_run_cannot_mount_is_refused_naming_the_field(
    tmp_path: Path, standin_tokenizer: Path, section: str, volume: dict, named: str
) -> None:
    run_file = manifest(tmp_path, standin_tokenizer, **{f"{section}.volume": volume})
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 2, result.stdout + result.stderr
    said = flat(result.stdout)
    assert f"spec.{section}.volume: {named} cannot be mounted by `datagen run` on one machine" in said
    assert f"set spec.{section}.path to the directory on this machine" in said
    assert not (tmp_path / "out").exists(), "nothing may be started"


def test_hostpath_volumes_are_read_as_their_directories(tmp_path: Path, standin_tokenizer: Path) -> None:
    """The cluster's layout (model volume at model.path, dataset and output paths inside their volumes), here."""
    models, data = tmp_path / "host-models", tmp_path / "host-data"
    shutil.copytree(standin_tokenizer, models / "kimi")
    (data / "prompts").mkdir(parents=True)
    shutil.copy(PROMPTS, data / "prompts" / "p.jsonl")
    run_file = manifest(
        tmp_path,
        standin_tokenizer,
        **{
            "model.path": "/models/kimi",
            "model.subPath": "kimi",
            "model.volume": {"hostPath": {"path": str(models)}},
            "dataset.path": "prompts/p.jsonl",
            "dataset.volume": {"hostPath": {"path": str(data)}},
            "output.path": "eagle3/run",
            "output.volume": {"hostPath": {"path": str(data)}},
        },
    )
    local = run_on_this_machine(load_run(run_file), tmp_path).spec
    assert (local.model.path, local.dataset.path, local.output.path) == (
        str(models / "kimi"),
        str(data / "prompts" / "p.jsonl"),
        str(data / "eagle3" / "run"),
    )
    result = datagen_run(run_file, *FAST_SIM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert stored_keys(data / "eagle3" / "run")


def test_subpath_and_a_tokenizer_inside_the_model_volume_follow_it(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(
        tmp_path,
        standin_tokenizer,
        **{
            "model.path": "/models/kimi",
            "model.subPath": "k2/int4",
            "model.tokenizerPath": "/models/kimi/tok",
            "model.volume": {"hostPath": {"path": "/srv/models"}},
        },
    )
    model = run_on_this_machine(load_run(run_file), tmp_path).spec.model
    assert (model.path, model.tokenizer_path) == ("/srv/models/k2/int4", "/srv/models/k2/int4/tok")
    with pytest.raises(SpecError) as refused:
        run_on_this_machine(
            load_run(manifest(tmp_path, standin_tokenizer, **{"model.volume": {"nfs": {"server": "s", "path": "/m"}}})),
            tmp_path,
        )
    assert [e.field for e in refused.value.errors] == ["spec.model.volume"]


def test_a_second_datagen_run_on_one_output_is_refused_naming_the_first(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    """One owner per output (output/lease.py): the second run is refused before it writes anything or starts a
    server; the first generates every prompt once and names itself in each record."""

    from datagen_operator.output.lease import read_lease

    out = tmp_path / "out"
    first = start_generating(manifest(tmp_path, standin_tokenizer, output=out, **{"clients.concurrency": 2}), out)
    lease = read_lease(out)
    assert lease is not None and lease.pid == first.pid
    run_yaml = (out / "run.yaml").read_bytes()

    second_dir = tmp_path / "second"
    second_dir.mkdir()
    with held(first):  # the first run still generating however long the second takes to start
        second = datagen_run(manifest(second_dir, standin_tokenizer, output=out), *FAST_SIM)
        assert list(out.glob("shards/*/*.jsonl")) and not list(out.glob("data/*.parquet")), "the first is mid-run"
    assert second.returncode == 1, second.stdout + second.stderr
    said = flat(second.stdout)
    assert f"OutputInUse: {out} is held by datagen run t (pid {first.pid} on {lease.host})" in said, said
    assert "started 1 server replica" not in said
    assert (out / "run.yaml").read_bytes() == run_yaml, "the second run wrote nothing into the output"

    stdout, _ = first.communicate(timeout=240)
    assert first.returncode == 0, stdout
    keys = stored_keys(out)
    assert len(keys) == len(set(keys)) == len([line for line in PROMPTS.read_text().splitlines() if line])
    import pyarrow.parquet as pq

    runs = {r for path in out.glob("data/*.parquet") for r in pq.read_table(path, columns=["run"])["run"].to_pylist()}
    assert runs == {f"local:{lease.host}:{first.pid}"}, "every record names the run that produced it"
    assert read_lease(out) is None, "the finished run gave its lease back"


def datagen_preflight(run_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "preflight", "--run", str(run_file), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_preflight_names_a_missing_or_unloadable_tokenizer_in_one_line_and_standin_builds_it(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    model = tmp_path / "models" / "qwen3"
    run_file = manifest(tmp_path, standin_tokenizer, **{"model.path": str(model), "model.preset": "qwen3"})

    missing = datagen_preflight(run_file)
    assert "Traceback" not in missing.stderr and "huggingface.co" not in missing.stderr, missing.stderr
    (line,) = missing.stderr.splitlines()
    assert f"spec.model.path: {model} does not exist on this machine" in line
    assert "spec.model.tokenizerPath" in line and "pass --standin" in line
    # No verdict (a model volume may still be filling): the step's Job would run it again, as after a crash.
    assert missing.returncode == EXIT_STEP_CRASHED and not model.exists()

    model.mkdir(parents=True)
    empty = datagen_preflight(run_file)
    assert "Traceback" not in empty.stderr, empty.stderr
    (line,) = empty.stderr.splitlines()
    assert f"spec.model.path: {model} holds no tokenizer that loads" in line and "tokenizer_config.json" in line
    model.rmdir()

    built = datagen_preflight(run_file, "--standin")
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"--standin: building the qwen3 stand-in tokenizer at {model}" in built.stderr
    assert orjson.loads(built.stdout)["passed"]
    assert (model / "tokenizer_config.json").exists()


def test_run_names_a_tokenizer_directory_that_does_not_load(tmp_path: Path, standin_tokenizer: Path) -> None:
    model = tmp_path / "models" / "empty"
    model.mkdir(parents=True)
    result = datagen_run(manifest(tmp_path, standin_tokenizer, **{"model.path": str(model)}), *FAST_SIM)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert f"spec.model.path: {model} holds no tokenizer that loads" in flat(result.stdout)
    assert not (tmp_path / "out").exists(), "nothing may be started"
