"""Condition reasons that cross a process boundary: a worker names them in its progress (and its exit
message), the operator and `datagen run` put them on the Succeeded condition unchanged."""

from __future__ import annotations

OUTPUT_VOLUME_FULL = "OutputVolumeFull"
"""ENOSPC or EDQUOT; also the reason when a worker's exit 7 comes without readable words."""
OUTPUT_VOLUME_READ_ONLY = "OutputVolumeReadOnly"
OUTPUT_VOLUME_ERROR = "OutputVolumeError"
"""EIO, or any other write failure of the volume."""
OUTPUT_VOLUME_REASONS = frozenset({OUTPUT_VOLUME_FULL, OUTPUT_VOLUME_READ_ONLY, OUTPUT_VOLUME_ERROR})
