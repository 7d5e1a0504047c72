"""Where a run's spec paths land, all three ways, each one call:

- in the operator's pods (`dataset_file`, `output_dir`, `export_dir`): the model volume is mounted at
  `model.path` (its `subPath` folder), the dataset and output volumes at fixed mount points (`POD_MOUNTS`) with
  `dataset.path` and `output.path` inside them; a path without a volume is the pod's own, as written;
- on this machine, for `datagen run` (`run_on_this_machine`): a `hostPath` volume is that directory here, so it is
  honoured the same way; a PersistentVolumeClaim or an NFS export has no place on this machine that `datagen run`
  could know, so it is refused naming the field, never silently ignored (a run that read other files than the
  manifest names would produce data nobody asked for);
- back from a cluster output copied or mounted here, for `datagen verify` and `datagen export`
  (`on_this_machine`): the volume's root is the output directory less `output.path`'s parts, and a dataset
  on the same volume is found from there.
"""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath

from datagen_operator.api.errors import FieldError, SpecError
from datagen_operator.api.kube_types import VolumeSource
from datagen_operator.api.spec import DataGenRun, DataGenRunSpec

DATASET_MOUNT = "/mnt/datagen/dataset"
OUTPUT_MOUNT = "/mnt/datagen/output"
POD_MOUNTS = (DATASET_MOUNT, OUTPUT_MOUNT)


def _inside(root: str, path: str) -> str:
    """`path` within a volume whose root is `root` (a mount point, or its directory on this machine)."""
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))


# --- in the pods ------------------------------------------------------------------------------------


def dataset_file(spec: DataGenRunSpec) -> str:
    """Where the pods see the dataset: inside its volume when it has one, else the path as written."""
    return _inside(DATASET_MOUNT, spec.dataset.path) if spec.dataset.volume else spec.dataset.path


def output_dir(spec: DataGenRunSpec) -> str:
    return _inside(OUTPUT_MOUNT, spec.output.path) if spec.output.volume else spec.output.path


def export_dir(spec: DataGenRunSpec) -> str:
    """spec.export.path inside the run's output directory (on the output volume)."""
    assert spec.export is not None
    return _inside(output_dir(spec), spec.export.path)


# --- on this machine (`datagen run`) --------------------------------------------------------------------


def _kind(volume: VolumeSource) -> str:
    if volume.persistent_volume_claim is not None:
        return f"a persistentVolumeClaim ({volume.persistent_volume_claim.claim_name})"
    assert volume.nfs is not None
    return f"an NFS export ({volume.nfs.server}:{volume.nfs.path})"


def _unhonoured(field: str, volume: VolumeSource, path_field: str) -> FieldError:
    return FieldError(
        field,
        f"{_kind(volume)} cannot be mounted by `datagen run` on one machine; remove {field} and set {path_field} "
        "to the directory on this machine (a hostPath volume is read here as its path), or run the manifest in "
        "a cluster (kubectl apply -f)",
    )


def _resolve(path: str, base: Path) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else (base / candidate).resolve()


def run_on_this_machine(run: DataGenRun, base: Path) -> DataGenRun:
    """A copy whose model, tokenizer, dataset and output paths are this machine's: relative paths against `base`
    (the manifest's folder), hostPath volumes as their directories. SpecError names every volume it cannot honour."""
    spec = run.spec
    errors: list[FieldError] = []
    model_path, tokenizer_path = spec.model.path, spec.model.tokenizer_path
    if spec.model.volume is not None:
        if spec.model.volume.host_path is None:
            errors.append(_unhonoured("spec.model.volume", spec.model.volume, "spec.model.path"))
        else:
            host = str(Path(spec.model.volume.host_path.path) / (spec.model.sub_path or ""))
            # The tokenizer lives in the model volume when its path is below the mount point.
            if tokenizer_path is not None and PurePosixPath(tokenizer_path).is_relative_to(model_path):
                tokenizer_path = str(Path(host) / PurePosixPath(tokenizer_path).relative_to(model_path))
            model_path = host
    paths: dict[str, str] = {}
    for section in ("dataset", "output"):
        part = getattr(spec, section)
        paths[section] = part.path
        if part.volume is None:
            continue
        if part.volume.host_path is None:
            errors.append(_unhonoured(f"spec.{section}.volume", part.volume, f"spec.{section}.path"))
        else:
            paths[section] = _inside(part.volume.host_path.path, part.path)
    if errors:
        raise SpecError(errors)
    model = spec.model.model_copy(
        update={
            "path": str(_resolve(model_path, base)),
            "tokenizer_path": None if tokenizer_path is None else str(_resolve(tokenizer_path, base)),
            "volume": None,
            "sub_path": None,
        }
    )
    dataset = spec.dataset.model_copy(update={"path": str(_resolve(paths["dataset"], base)), "volume": None})
    output = spec.output.model_copy(update={"path": str(_resolve(paths["output"], base)), "volume": None})
    return run.model_copy(
        update={"spec": spec.model_copy(update={"model": model, "dataset": dataset, "output": output})}
    )


# --- back from a cluster output read here (`datagen verify`, `datagen export`) -----------------------


def inside_volume(path: str) -> str:
    """A spec path on a volume, or a pod's path under its mount point, as the path within the volume."""
    for mount in POD_MOUNTS:
        if path == mount or path.startswith(mount + "/"):
            return path[len(mount) :].lstrip("/")
    return path.lstrip("/")


def volume_root(spec: DataGenRunSpec, output: Path) -> Path | None:
    """The output volume's root on this machine: OUTPUT less spec.output.path's parts, when it ends in them."""
    if spec.output.volume is None:
        return None
    parts = Path(inside_volume(spec.output.path)).parts
    resolved = output.resolve()
    if not parts or resolved.parts[-len(parts) :] != parts:
        return None
    return resolved.parents[len(parts) - 1]


def on_this_machine(spec: DataGenRunSpec, output: Path) -> tuple[Path | None, list[str]]:
    """The run's dataset as this machine sees it, and notes on paths that are the pods' only.

    A cluster output's run.yaml is the applied manifest: a path on a volume is relative to that volume (or,
    written by a pod, under its mount). The output directory is that volume's `spec.output.path`, so the
    volume's root is OUTPUT less those parts, and a dataset on the same volume is found from there."""
    written = Path(spec.dataset.path)
    if written.is_file():
        return written, []
    notes: list[str] = []
    root = volume_root(spec, output)
    candidate = None
    if root is not None and spec.dataset.volume is not None and spec.dataset.volume == spec.output.volume:
        candidate = root / inside_volume(spec.dataset.path)
    if candidate is not None and candidate.is_file():
        return candidate, notes
    notes.append(
        f"spec.dataset.path {spec.dataset.path} is not a file here"
        + (f" (nor {candidate})" if candidate is not None else "")
        + ": pass --dataset FILE to re-render prompts"
    )
    return None, notes
