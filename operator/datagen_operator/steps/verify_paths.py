"""Where a cluster output's spec paths land on this machine, the reverse of the pods' view (k8s/pod_paths.py): the
run's spec as `datagen verify` and export's gate read it (load_run_spec), and its dataset found on the output's
volume (on_this_machine).
"""

from __future__ import annotations

from pathlib import Path

from datagen_operator.api.mounts import POD_MOUNTS
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.output.layout import OutputLayout


def on_this_machine(spec: DataGenRunSpec, output: Path) -> tuple[Path | None, list[str]]:
    """The run's dataset as this machine sees it, and notes on paths that are the pods' only.

    A cluster output's run.yaml is the applied manifest: a path on a volume is relative to that volume (or,
    written by a pod, under its mount). The output directory is that volume's `spec.output.path`, so the
    volume's root is OUTPUT less those parts, and a dataset on the same volume is found from there."""
    written = Path(spec.dataset.path)
    if written.is_file():
        return written, []
    notes: list[str] = []
    root = _volume_root(spec, output)
    candidate = None
    if root is not None and spec.dataset.volume is not None and spec.dataset.volume == spec.output.volume:
        candidate = root / _inside_volume(spec.dataset.path)
    if candidate is not None and candidate.is_file():
        return candidate, notes
    notes.append(
        f"spec.dataset.path {spec.dataset.path} is not a file here"
        + (f" (nor {candidate})" if candidate is not None else "")
        + ": pass --dataset FILE to re-render prompts"
    )
    return None, notes


def _inside_volume(path: str) -> str:
    for mount in POD_MOUNTS:
        if path == mount or path.startswith(mount + "/"):
            return path[len(mount) :].lstrip("/")
    return path.lstrip("/")


def _volume_root(spec: DataGenRunSpec, output: Path) -> Path | None:
    """The output volume's root on this machine: OUTPUT less spec.output.path's parts, when it ends in them."""
    if spec.output.volume is None:
        return None
    parts = Path(_inside_volume(spec.output.path)).parts
    resolved = output.resolve()
    if not parts or resolved.parts[-len(parts) :] != parts:
        return None
    return resolved.parents[len(parts) - 1]


def load_run_spec(output: Path, run_file: Path | None = None) -> DataGenRunSpec | None:
    """The run's spec (--run, else OUTPUT/run.yaml; None when there is none) with its paths as this machine
    reads them: a local run's relative paths against its manifest's folder; a cluster run's (volumes named)
    left as written, for on_this_machine to place."""
    from datagen_operator.api import anchor_paths, load_run

    run_file = run_file or OutputLayout(output).run_file
    if not run_file.exists():
        return None
    run = load_run(run_file)
    if run.spec.output.volume is not None or run.spec.dataset.volume is not None:
        return run.spec
    return anchor_paths(run, run_file.resolve().parent).spec
