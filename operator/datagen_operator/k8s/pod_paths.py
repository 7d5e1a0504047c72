"""A datagen pod's own fixed places: the run file (a ConfigMap mount) and the termination log. Where the spec's paths
land inside a pod (the dataset, the output, the export folder) is api/paths.py's, with this machine's view and the
reverse."""

from __future__ import annotations

RUN_FILE_DIR = "/etc/datagen"
RUN_FILE = f"{RUN_FILE_DIR}/run.yaml"
TERMINATION_LOG = "/dev/termination-log"
