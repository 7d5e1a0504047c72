"""A failing output volume: which errors are the volume's, its free space, and the words that say what to do."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import TypeGuard

from datagen_operator.api.reasons import Reason

VOLUME_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
"""Write failures that are the volume's, not this program's: retrying on the same volume cannot help."""
VOLUME_REASONS = {
    errno.ENOSPC: Reason.OUTPUT_VOLUME_FULL,
    errno.EDQUOT: Reason.OUTPUT_VOLUME_FULL,
    errno.EROFS: Reason.OUTPUT_VOLUME_READ_ONLY,
    errno.EIO: Reason.OUTPUT_VOLUME_ERROR,
}


def volume_reason(error: OSError) -> Reason:
    """The condition reason for a failed write of the output volume."""
    return VOLUME_REASONS.get(error.errno or 0, Reason.OUTPUT_VOLUME_ERROR)


def is_volume_error(error: BaseException) -> TypeGuard[OSError]:
    return isinstance(error, OSError) and error.errno in VOLUME_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Free bytes (for this user) of the filesystem holding `path` or its nearest existing parent."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def volume_failure_text(reason: str, output: str | Path, free: int | None, done: int, total: int, why: str = "") -> str:
    """The cause in plain words and what to do: the same sentence on stderr, in progress and the condition."""
    whats: dict[str, str] = {
        Reason.OUTPUT_VOLUME_FULL: f"{output} has {free if free is not None else 'an unknown number of'} bytes free",
        Reason.OUTPUT_VOLUME_READ_ONLY: f"{output} is read-only",
    }
    fixes: dict[str, str] = {
        Reason.OUTPUT_VOLUME_FULL: "free space or grow the volume and the run resumes",
        Reason.OUTPUT_VOLUME_READ_ONLY: "mount the volume writable and the run resumes",
    }
    what = whats.get(reason, f"{output} fails to write")
    fix = fixes.get(reason, "repair or replace the volume and the run resumes")
    return f"{what} after {done}/{total} records" + (f" ({why})" if why else "") + f"; {fix}"


class PartialFlush(OSError):
    """A flush that failed part-way: the whole records before the failure are kept, the rest is not written."""

    def __init__(self, error: OSError, unwritten: int) -> None:
        super().__init__(error.errno, error.strerror, error.filename)
        self.unwritten = unwritten
