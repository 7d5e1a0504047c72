"""The pinned SGLang wheel, downloaded once and unpacked once into a cache keyed by its version.

`pip download --no-deps sglang==X` fetches the release; the unpacked copy is what the contract tests import
(never installed, never committed). `DATAGEN_WHEEL_CACHE` moves the cache (default
~/.cache/datagen-operator/wheels).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from datagen_operator.presets.sglang_names import PINNED_SGLANG_VERSION

UNPACKED_MARKER = ".unpacked"


def cache_dir(version: str = PINNED_SGLANG_VERSION) -> Path:
    root = os.environ.get("DATAGEN_WHEEL_CACHE") or Path.home() / ".cache" / "datagen-operator" / "wheels"
    return Path(root) / f"sglang-{version}"


def sglang_wheel(version: str = PINNED_SGLANG_VERSION) -> Path:
    """The release's wheel file, downloaded on first use."""
    cache = cache_dir(version)
    wheels = sorted(cache.glob("sglang-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(cache),
             f"sglang=={version}"],
            check=True,
        )  # fmt: skip
        wheels = sorted(cache.glob("sglang-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no sglang {version} wheel in {cache}")
    return wheels[-1]


def unpacked_sglang(version: str = PINNED_SGLANG_VERSION) -> Path:
    """A directory holding the release's `sglang` package, for `sys.path`. Unpacked atomically, once."""
    target = cache_dir(version) / "unpacked"
    if (target / UNPACKED_MARKER).exists():
        return target
    wheel = sglang_wheel(version)
    staging = Path(tempfile.mkdtemp(prefix="unpacking-", dir=target.parent))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(staging)
    (staging / UNPACKED_MARKER).write_text(wheel.name)
    try:
        staging.rename(target)
    except OSError:  # another session unpacked it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target
