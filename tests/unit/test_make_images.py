"""`make images` picks a container engine the way the Makefile says: CONTAINER_ENGINE if set (and only
that one), else the first of docker, podman, nerdctl that answers `<engine> info`; with none it says so.
No engine runs here, so fake ones on a PATH of their own record what they are asked to do."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = next(
    line.split('"')[1] for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
)


def make_images(tmp_path: Path, engines: dict[str, bool], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Runs `make images` with only the given fake engines on PATH (True: `info` works); returns the exit
    code, what make printed, and the calls the engines received (one line each: engine and args)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for engine, works in engines.items():
        script = bin_dir / engine
        script.write_text(
            f'#!/bin/sh\necho "{engine} $*" >> "{calls}"\nif [ "$1" = info ]; then exit {0 if works else 1}; fi\n'
        )
        script.chmod(0o755)
    (bin_dir / "sed").symlink_to(shutil.which("sed") or "/bin/sed")  # the Makefile reads the version with it
    result = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "images"],
        cwd=REPO_ROOT,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), **(env or {})},  # no real engine can answer
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout + result.stderr, calls.read_text() if calls.exists() else ""


def builds(calls: str) -> list[str]:
    return [line for line in calls.splitlines() if " build " in line]


def expected_builds(engine: str) -> list[str]:
    return [
        f"{engine} build -f images/Dockerfile.operator -t ghcr.io/datagen-operator/operator:{VERSION} .",
        f"{engine} build -f images/Dockerfile.worker -t ghcr.io/datagen-operator/datagen:{VERSION} .",
    ]


@pytest.mark.parametrize(
    ("engines", "chosen"),
    [
        ({"docker": True, "podman": True, "nerdctl": True}, "docker"),
        ({"docker": False, "podman": True}, "podman"),
        ({"nerdctl": True}, "nerdctl"),
        ({"docker": False, "podman": False, "nerdctl": True}, "nerdctl"),
    ],
)
def test_the_first_engine_that_answers_builds_both_images(
    tmp_path: Path, engines: dict[str, bool], chosen: str
) -> None:
    code, output, calls = make_images(tmp_path, engines)
    assert code == 0, output
    assert f"building with {chosen}" in output
    assert builds(calls) == expected_builds(chosen)


def test_no_working_engine_fails_with_a_message_and_builds_nothing(tmp_path: Path) -> None:
    code, output, calls = make_images(tmp_path, {"docker": False, "podman": False})
    assert code != 0
    assert "no working container engine" in output and "docker podman nerdctl" in output, output
    assert builds(calls) == []


def test_an_explicit_engine_is_used_and_never_swapped_for_another(tmp_path: Path) -> None:
    code, output, calls = make_images(tmp_path, {"docker": True, "podman": True}, {"CONTAINER_ENGINE": "podman"})
    assert code == 0, output
    assert builds(calls) == expected_builds("podman")

    broken = tmp_path / "broken"
    broken.mkdir()
    code, output, calls = make_images(broken, {"docker": True, "podman": False}, {"CONTAINER_ENGINE": "podman"})
    assert code != 0
    assert "CONTAINER_ENGINE=podman does not work here" in output, output
    assert builds(calls) == []


def test_registry_and_tag_can_be_overridden(tmp_path: Path) -> None:
    code, output, calls = make_images(
        tmp_path, {"docker": True}, {"IMAGE_REGISTRY": "registry.example/me", "IMAGE_TAG": "dev"}
    )
    assert code == 0, output
    assert [line.split(" -t ")[1] for line in builds(calls)] == [
        "registry.example/me/operator:dev .",
        "registry.example/me/datagen:dev .",
    ]
