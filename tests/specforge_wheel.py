"""SpecForge's torch-free data code, from the pinned PyPI wheel, downloaded once and cached.

SpecForge 0.2.0 imports torch in its parsers (specforge/data/parse.py) and pins sglang, so the project's venv does
not install it (`make test-consumers` runs the parsers in a venv of its own, docs/testing.md). Two of its data
modules need no torch: `specforge.data.prompt_builder` (its online trainer's prompt loader; the pre-tokenized
path is standard library only) and `specforge.data.template` (the chat-template registry, pydantic). The wheel is
fetched with `pip download --no-deps` (a package registry, as tests/real_templates.py fetches its sdist), checked
against its pinned sha256, and unpacked; `import_specforge(name)` imports a module from it. Nothing is committed.
`DATAGEN_SPECFORGE_CACHE` moves the cache (default ~/.cache/datagen-operator/specforge).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

VERSION = "0.2.0"
WHEEL_SHA256 = "fbc79517adf483c6a8beea52561b1a8c8c8a99a54c820b47d2033a73966b55b0"
TORCH_FREE = ("specforge.data.prompt_builder", "specforge.data.template")


def unpacked(version: str = VERSION, sha256: str = WHEEL_SHA256) -> Path:
    root = Path(os.environ.get("DATAGEN_SPECFORGE_CACHE") or Path.home() / ".cache" / "datagen-operator" / "specforge")
    cache = root / f"specforge-{version}"
    target = cache / "unpacked"
    if (target / "specforge" / "data" / "prompt_builder.py").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / f"specforge-{version}-py3-none-any.whl"
    if not wheel.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
             "-d", str(cache), f"specforge=={version}"],
            check=True,
        )  # fmt: skip
    found = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if found != sha256:
        raise ValueError(f"{wheel}: sha256 {found}, pinned {sha256}")
    partial = cache / "unpacking"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(partial)
    partial.rename(target)
    return target


def import_specforge(name: str) -> ModuleType:
    """One of SpecForge's torch-free modules (TORCH_FREE), from the pinned wheel."""
    if name not in TORCH_FREE:
        raise ValueError(f"{name} imports torch; one of {', '.join(TORCH_FREE)}")
    path = str(unpacked())
    if path not in sys.path:
        sys.path.append(path)
    return importlib.import_module(name)
