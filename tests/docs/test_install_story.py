"""The README's way in, from a checkout: `make dist` builds a wheel that holds the `datagen` command and the
package's data, and what the README and docs tell a user to `pip install` exists (no package is published)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.harness.testbin import REPO_ROOT

VERSION = next(
    line.split('"')[1] for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
)


def test_make_dist_builds_a_wheel_that_runs_datagen(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # The venv this test runs in, taken as it is (-o): reinstalling it is not what is tested.
    venv = sys.prefix
    make = [shutil.which("make") or "make", "--no-print-directory", f"VENV={venv}", "-o", f"{venv}/.installed"]
    result = subprocess.run(
        [*make, "dist", f"DIST={dist}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    wheel = dist / f"datagen_operator-{VERSION}-py3-none-any.whl"
    assert str(wheel) in result.stdout, result.stdout
    names = zipfile.ZipFile(wheel).namelist()
    assert "datagen_operator/presets/presets.yaml" in names
    assert any(name.startswith("datagen_operator/tokenizer/") and name.endswith(".jinja") for name in names)
    entry_points = zipfile.ZipFile(wheel).read(f"datagen_operator-{VERSION}.dist-info/entry_points.txt").decode()
    assert "datagen = datagen_operator.cli:main" in entry_points
    # The wheel alone (its dependencies from this venv) serves the commands: installed into a folder of its own.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = "import datagen_operator, sys; print(datagen_operator.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(target)), where.stdout
    presets = subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "presets"], env=env, capture_output=True, text=True, timeout=60
    )
    assert presets.returncode == 0 and "kimi-k2.5" in presets.stdout, presets.stderr


def test_what_the_docs_pip_install_is_this_checkout_or_its_wheel() -> None:
    """`pip install datagen-operator...` from an index would fail: nothing is published under that name."""
    for page in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            for target in re.findall(r"pip install (?:-\S+ )*'?([^\s']+)", line):
                assert target.startswith((".", "dist/", "-e")) or target.endswith(".whl") or "datagen" not in target, (
                    f"{page.name}: {line.strip()}"
                )


def test_the_readme_says_where_datagen_is_after_make_demo() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in readme and ".venv/bin/datagen" in readme
    demo = (REPO_ROOT / "hack" / "demo.sh").read_text()
    assert "source .venv/bin/activate" in demo
