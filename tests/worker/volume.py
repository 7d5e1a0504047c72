"""A real, small, fillable filesystem for tests of a full output volume.

Preferred: a size-limited tmpfs mounted for the test (needs root or CAP_SYS_ADMIN); it is grown with
`mount -o remount,size=...`. Where mounting is not permitted, the fallback still tests a real ENOSPC: the
shared /dev/shm tmpfs, pre-filled with a ballast file so only the wanted bytes are free (growing frees
the ballast). Only where neither exists is the test skipped, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MOUNT_SIZE = 8 * 1024 * 1024
SHM_FALLBACK_MAX_FREE = 4 * 1024 * 1024 * 1024
"""Pre-fill /dev/shm only when it is small enough to fill quickly (a container's 64 MiB, not half the RAM)."""


@dataclass
class Volume:
    root: Path
    """A folder on the small filesystem; put the output under it."""
    mounted: bool
    ballast: Path

    def free(self) -> int:
        return shutil.disk_usage(self.root).free

    def leave_free(self, free_bytes: int) -> None:
        """Fill the filesystem with a ballast file until about `free_bytes` are left (page granularity)."""
        self.ballast.unlink(missing_ok=True)
        size = self.free() - free_bytes
        if size <= 0:
            return
        with self.ballast.open("wb") as file:
            chunk = bytes(1 << 20)
            while size > 0:
                size -= file.write(chunk[: min(size, len(chunk))])
            file.flush()
            os.fsync(file.fileno())

    def grow(self) -> None:
        """What an operator does about a full volume: free the ballast and, when mounted, enlarge it."""
        self.ballast.unlink(missing_ok=True)
        if self.mounted:
            subprocess.run(["mount", "-o", f"remount,size={4 * MOUNT_SIZE}", str(self.root)], check=True)


def _try_mount(path: Path) -> bool:
    if shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={MOUNT_SIZE},mode=0777", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    return done.returncode == 0


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Volume]:
    mount_point = tmp_path / "volume"
    if _try_mount(mount_point):
        try:
            yield Volume(mount_point, True, mount_point / ".ballast")
        finally:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)
        return
    shm = Path("/dev/shm")
    if not shm.is_dir() or shutil.disk_usage(shm).free > SHM_FALLBACK_MAX_FREE:
        pytest.skip(
            "cannot mount a size-limited tmpfs here (needs root or CAP_SYS_ADMIN), and /dev/shm is missing or "
            "too large to pre-fill: no real full filesystem to test on"
        )
    root = shm / f"datagen-volume-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    try:
        yield Volume(root, False, shm / f".{root.name}.ballast")
    finally:
        (shm / f".{root.name}.ballast").unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
