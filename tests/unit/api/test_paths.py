"""Where spec paths land (api/paths.py), all three ways agreeing: a spec path as a pod sees it, then read back from a
copy of the volume on this machine, names the same file; on one machine a hostPath volume is read where the pods
would see it, and a volume this machine cannot mount is refused naming its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.errors import SpecError
from datagen_operator.api.paths import (
    DATASET_MOUNT,
    OUTPUT_MOUNT,
    dataset_file,
    inside_volume,
    on_this_machine,
    output_dir,
    run_on_this_machine,
)
from datagen_operator.api.spec import DataGenRun, DataGenRunSpec
from tests.manifests import run_document, unit_spec

VOLUMES: dict[str, dict[str, Any]] = {
    "persistentVolumeClaim": {"persistentVolumeClaim": {"claimName": "data"}},
    "hostPath": {"hostPath": {"path": "/srv/data"}},
    "nfs": {"nfs": {"server": "nfs.local", "path": "/exports/data"}},
}
PATHS = [
    ("prompts/b1.jsonl", "eagle3/b1"),
    ("/prompts/b1.jsonl", "/eagle3/b1/"),
    ("./prompts/b1.jsonl", "eagle3/./b1"),
]


def _spec(volume: dict[str, Any] | None, dataset: str, output: str, *, model_volume: bool = True) -> DataGenRunSpec:
    """unit_spec's run with the dataset and output on one volume (or none); its model on a PVC unless told not."""
    spec = unit_spec(
        **{"dataset.path": dataset, "dataset.volume": volume, "output.path": output, "output.volume": volume}
    )
    for section in ("dataset", "output") if volume is None else ():
        del spec[section]["volume"]
    if not model_volume:
        del spec["model"]["volume"]
    return parse_spec(spec)


def _run(spec: DataGenRunSpec) -> DataGenRun:
    return DataGenRun.model_validate(run_document(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))


@pytest.mark.parametrize("kind", sorted(VOLUMES))
@pytest.mark.parametrize(("dataset", "output"), PATHS)
def test_a_spec_path_seen_by_a_pod_and_read_back_here_names_the_same_file(
    tmp_path: Path, kind: str, dataset: str, output: str
) -> None:
    spec = _spec(VOLUMES[kind], dataset, output)
    pod_dataset, pod_output = dataset_file(spec), output_dir(spec)
    assert pod_dataset.startswith(DATASET_MOUNT + "/") and pod_output.startswith(OUTPUT_MOUNT + "/")
    # Spec -> pod -> within the volume: the spec's own path, whichever way the pod's path was written down.
    assert Path(inside_volume(pod_dataset)) == Path(inside_volume(dataset)) == Path("prompts/b1.jsonl")
    assert Path(inside_volume(pod_output)) == Path(inside_volume(output)) == Path("eagle3/b1")
    # The volume copied here: the output found under its root, the dataset beside it.
    root = tmp_path / "volume"
    here = root / inside_volume(pod_dataset)
    here.parent.mkdir(parents=True)
    here.write_text("{}\n")
    for written in (spec, spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"path": pod_dataset})})):
        assert on_this_machine(written, root / inside_volume(pod_output)) == (here, [])
    # Elsewhere than the output's own folder: not found, and the note says how to name it.
    found, notes = on_this_machine(spec, tmp_path / "elsewhere")
    assert found is None and "pass --dataset FILE" in notes[0]


@pytest.mark.parametrize(("dataset", "output"), PATHS)
def test_a_host_path_volume_is_read_here_where_the_pods_see_it(tmp_path: Path, dataset: str, output: str) -> None:
    host = tmp_path / "srv"
    spec = _spec({"hostPath": {"path": str(host)}}, dataset, output, model_volume=False)
    local = run_on_this_machine(_run(spec), tmp_path)
    assert Path(local.spec.dataset.path) == host / inside_volume(dataset_file(spec))
    assert Path(local.spec.output.path) == host / inside_volume(output_dir(spec))
    Path(local.spec.dataset.path).parent.mkdir(parents=True)
    Path(local.spec.dataset.path).write_text("{}\n")
    assert on_this_machine(spec, Path(local.spec.output.path)) == (Path(local.spec.dataset.path), [])


@pytest.mark.parametrize("kind", ["persistentVolumeClaim", "nfs"])
def test_a_volume_this_machine_cannot_mount_is_refused_naming_its_field(kind: str) -> None:
    spec = _spec(VOLUMES[kind], *PATHS[0])
    with pytest.raises(SpecError) as refused:
        run_on_this_machine(_run(spec), Path("/"))
    assert [e.field for e in refused.value.errors] == ["spec.model.volume", "spec.dataset.volume", "spec.output.volume"]


def test_a_path_without_a_volume_is_the_same_path_everywhere(tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("{}\n")
    spec = _spec(None, str(dataset), str(tmp_path / "out"))
    assert (dataset_file(spec), output_dir(spec)) == (str(dataset), str(tmp_path / "out"))
    assert on_this_machine(spec, Path("/anywhere")) == (dataset, [])
