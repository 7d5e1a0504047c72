"""The models' published chat templates, from the pinned llama-cpp-python sdist, downloaded once and cached.

llama.cpp keeps copies of models' chat templates (vendor/llama.cpp/models/templates/*.jinja, fetched from the
models' repositories) for its own tests, and llama-cpp-python's source distribution on PyPI ships them.
`pip download --no-deps --no-binary :all: llama-cpp-python==X` fetches it (a package registry, so `make test`
stays offline-capable otherwise); only the templates asked for are extracted. Nothing of it is committed.
`DATAGEN_REAL_TEMPLATES_CACHE` moves the cache (default ~/.cache/datagen-operator/real-templates), keyed by
version; the sdist's sha256 is pinned, so the templates the tests read are the ones they were written against.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TEMPLATES_IN_SDIST = "vendor/llama.cpp/models/templates"


CACHE_ENV = "DATAGEN_REAL_TEMPLATES_CACHE"


def cache_dir(version: str = VERSION) -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "datagen-operator" / "real-templates"
    return Path(root) / f"llama-cpp-python-{version}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sdist(version: str = VERSION, sha256: str = SDIST_SHA256) -> Path:
    """The release's source archive, downloaded on first use and checked against its pinned hash."""
    cache = cache_dir(version)
    archives = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             "-d", str(cache), f"llama-cpp-python=={version}"],
            check=True,
        )  # fmt: skip
        archives = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise FileNotFoundError(f"no llama-cpp-python {version} sdist in {cache}")
    found = _sha256(archives[-1])
    if found != sha256:
        raise ValueError(f"{archives[-1]}: sha256 {found}, pinned {sha256}")
    return archives[-1]


def _extract(names: set[str], version: str, target: Path) -> None:
    """Write the templates `names` from the sdist into `target`, each atomically (one pass over the archive)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist(version)) as archive:
        for member in archive:
            directory, _, name = member.name.rpartition("/")
            if name not in names or not member.isfile() or not directory.endswith(TEMPLATES_IN_SDIST):
                continue
            source = archive.extractfile(member)
            assert source is not None
            with tempfile.NamedTemporaryFile(dir=target, prefix=f".{name}.", delete=False) as staging:
                staging.write(source.read())
            Path(staging.name).replace(target / name)  # readers see a whole file or none
            names = names - {name}
    if names:
        raise FileNotFoundError(f"not in llama-cpp-python {version}'s {TEMPLATES_IN_SDIST}: {', '.join(sorted(names))}")


def real_templates(names: Iterable[str], version: str = VERSION) -> dict[str, str]:
    """The templates `names` (file names in llama.cpp's models/templates), extracted on first use."""
    wanted = sorted(set(names))
    target = cache_dir(version) / "templates"
    missing = {name for name in wanted if not (target / name).is_file()}
    if missing:
        _extract(missing, version, target)
    return {name: (target / name).read_text(encoding="utf-8") for name in wanted}
