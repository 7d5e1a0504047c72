"""Where the operator's pods mount a run's volumes: k8s/pod_parts.py mounts them there, and `datagen verify`
(steps/verify_paths.py) strips them from a cluster output's paths, which mean nothing on another machine."""

from __future__ import annotations

DATASET_MOUNT = "/mnt/datagen/dataset"
OUTPUT_MOUNT = "/mnt/datagen/output"
POD_MOUNTS = (DATASET_MOUNT, OUTPUT_MOUNT)
