"""The pod's view of the spec's paths: where the dataset, the output, the export folder, the run file and the
termination log are inside a datagen pod (the volumes mounted at api/mounts.py's places). Pure."""

from __future__ import annotations

import posixpath

from datagen_operator.api.mounts import DATASET_MOUNT, OUTPUT_MOUNT
from datagen_operator.api.spec import DataGenRunSpec

RUN_FILE_DIR = "/etc/datagen"
RUN_FILE = f"{RUN_FILE_DIR}/run.yaml"
TERMINATION_LOG = "/dev/termination-log"
CANARY_RECORDS = "canary.jsonl"
"""In the output folder, as `datagen run` writes it: the canary's records, kept whether it passed or not."""


def _inside(mount: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(mount, path.lstrip("/")))


def dataset_file(spec: DataGenRunSpec) -> str:
    """Where the pods see the dataset: inside its volume when it has one, else the path as written."""
    return _inside(DATASET_MOUNT, spec.dataset.path) if spec.dataset.volume else spec.dataset.path


def output_dir(spec: DataGenRunSpec) -> str:
    return _inside(OUTPUT_MOUNT, spec.output.path) if spec.output.volume else spec.output.path


def export_dir(spec: DataGenRunSpec) -> str:
    """spec.export.path inside the run's output directory (on the output volume)."""
    assert spec.export is not None
    return _inside(output_dir(spec), spec.export.path)
