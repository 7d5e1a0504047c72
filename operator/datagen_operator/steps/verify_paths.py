"""The run's spec as `datagen verify` and export's gate read it (load_run_spec): its paths as this machine reads them,
a cluster run's for api/paths.py's `on_this_machine` to place."""

from __future__ import annotations

from pathlib import Path

from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.output.layout import OutputLayout


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
