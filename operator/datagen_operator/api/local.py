"""A run's paths on one machine (`datagen run`): what each spec path names here, or why it cannot be honoured.

In a cluster the model volume is mounted at `model.path` (its `subPath` folder), the dataset and output volumes
at fixed mount points with `dataset.path` and `output.path` inside them. On one machine a `hostPath` volume is
that directory here, so it is honoured the same way; a PersistentVolumeClaim or an NFS export has no place on
this machine that `datagen run` could know, so it is refused naming the field, never silently ignored (a run
that read other files than the manifest names would produce data nobody asked for).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from datagen_operator.api.errors import FieldError, SpecError
from datagen_operator.api.kube_types import VolumeSource
from datagen_operator.api.spec import DataGenRun


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


def _inside(root: str, path: str) -> str:
    """`path` within a volume's directory, as the pod sees it below the mount point."""
    return str(Path(root) / PurePosixPath(path).relative_to(PurePosixPath(path).anchor or "."))


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
