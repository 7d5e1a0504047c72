"""`make images` (hack/images/build.sh) picks how to build the way the Makefile says: CONTAINER_ENGINE if set (and
only that one), else the first of docker, podman, nerdctl that answers `<engine> info` and has or can pull the
python base image; else the Debian route (buildah, podman, mmdebstrap: no registry); with none it says so.
Fake engines and tools on a PATH of their own record what they are asked to do (the real route is what
tests/images checks, on images it built)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
VERSION = next(
    line.split('"')[1] for line in (REPO_ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version")
)
# What the script needs besides the engines (the Makefile runs it with /bin/bash).
TOOLS = ("sed", "cat", "mkdir", "chmod", "rm", "mv", "du", "tr", "cut", "sha256sum", "id", "head", "ls")
DEBIAN_TOOLS = ("buildah", "mmdebstrap", "runc", "skopeo")
WORKS, BROKEN, OFFLINE = "works", "broken", "offline"  # OFFLINE: answers `info`, cannot get the base image


def fake(path: Path, calls: Path, mode: str = WORKS) -> None:
    """A fake engine or tool: records its arguments (and the engine configuration it was given); writes the
    files it is asked to (`-o FILE`, mmdebstrap's target), as the real ones do."""
    name = path.name
    path.write_text(
        "#!/bin/bash\n"
        f'echo "{name} $* ${{CONTAINERS_CONF:+[CONTAINERS_CONF=$CONTAINERS_CONF]}}" >> "{calls}"\n'
        f'case "$1" in info) [ {mode} != {BROKEN} ]; exit;; pull) [ {mode} = {WORKS} ]; exit;; esac\n'
        f'case "$1 $2 $*" in "image inspect "*python:*) [ {mode} = {WORKS} ]; exit;; "image inspect "*) echo id1; exit;; esac\n'
        'previous=; for arg; do case "$previous $arg" in "-o "*|*.partial) echo fake > "$arg";; esac; previous=$arg; done\n'
    )
    path.chmod(0o755)


def make_images(tmp_path: Path, engines: dict[str, str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Runs `make images` with only the given fake engines (and tools) on PATH; returns the exit code, what
    make printed, and the calls the fakes received (one line each: name and args)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for engine, mode in engines.items():
        fake(bin_dir / engine, calls, mode)
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    result = subprocess.run(
        [shutil.which("make") or "make", "--no-print-directory", "images"],
        cwd=REPO_ROOT,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "IMAGES_OUT": str(tmp_path / "out"), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout + result.stderr, calls.read_text() if calls.exists() else ""


def builds(calls: str) -> list[str]:
    return [line.strip() for line in calls.splitlines() if " build " in line or line.startswith("buildah bud")]


def expected_builds(engine: str, registry: str = "ghcr.io/datagen-operator", tag: str = VERSION) -> list[str]:
    return [
        f"{engine} build --build-arg VERSION={VERSION} -f images/Dockerfile.operator -t {registry}/operator:{tag} .",
        f"{engine} build --build-arg VERSION={VERSION} -f images/Dockerfile.worker -t {registry}/datagen:{tag} .",
    ]


@pytest.mark.parametrize(
    ("engines", "chosen"),
    [
        ({"docker": WORKS, "podman": WORKS, "nerdctl": WORKS}, "docker"),
        ({"docker": BROKEN, "podman": WORKS}, "podman"),
        ({"docker": OFFLINE, "podman": WORKS}, "podman"),
        ({"nerdctl": WORKS}, "nerdctl"),
        ({"docker": BROKEN, "podman": BROKEN, "nerdctl": WORKS}, "nerdctl"),
    ],
)
def test_the_first_engine_that_answers_builds_both_images_and_saves_them(
    tmp_path: Path, engines: dict[str, str], chosen: str
) -> None:
    code, output, calls = make_images(tmp_path, engines)
    assert code == 0, output
    assert f"building with {chosen}" in output
    assert builds(calls) == expected_builds(chosen)
    out = tmp_path / "out"
    assert f"{chosen} save" in calls and (out / "operator.tar").is_file() and (out / "worker.tar").is_file()
    assert (out / "refs").read_text() == f"operator=ghcr.io/datagen-operator/operator:{VERSION}\n" + (
        f"worker=ghcr.io/datagen-operator/datagen:{VERSION}\n"
    )


def test_no_working_engine_and_no_debian_tools_fails_with_a_message_and_builds_nothing(tmp_path: Path) -> None:
    code, output, calls = make_images(tmp_path, {"docker": BROKEN, "podman": OFFLINE})
    assert code != 0
    assert "no working container engine" in output and "docker podman nerdctl" in output, output
    assert "buildah podman mmdebstrap runc skopeo" in output, output
    assert builds(calls) == []


def test_without_a_registry_the_debian_route_builds_on_a_base_made_here(tmp_path: Path) -> None:
    engines = {"docker": BROKEN, "podman": OFFLINE, **dict.fromkeys(DEBIAN_TOOLS, WORKS)}
    code, output, calls = make_images(tmp_path, engines, {"DATAGEN_IMAGES_CACHE": str(tmp_path / "cache")})
    assert code == 0, output
    made = [line for line in calls.splitlines() if line.startswith("mmdebstrap ")]
    assert len(made) == 1 and "--variant=minbase" in made[0], calls
    assert "--include=python3,python3-venv,ca-certificates" in made[0] and "python3 -m venv /usr/local" in made[0]
    bases = list((tmp_path / "cache").glob("base-*.tar"))
    assert len(bases) == 1, calls  # cached outside the repo, named by its recipe
    conf = f"[CONTAINERS_CONF={REPO_ROOT / 'images' / 'containers.conf'}]"
    base = "localhost/datagen-base:" + bases[0].name.removeprefix("base-").removesuffix(".tar")
    ca = "/etc/ssl/certs/ca-certificates.crt"
    assert builds(calls) == [
        f"buildah bud --layers --isolation chroot --network host --build-arg PYTHON_IMAGE={base} "
        f"--build-arg VERSION={VERSION} -v {ca}:{ca}:ro --ignorefile images/Dockerfile.{name}.dockerignore "
        f"-f images/Dockerfile.{name} -t ghcr.io/datagen-operator/{ref}:{VERSION} . {conf}"
        for name, ref in (("operator", "operator"), ("worker", "datagen"))
    ]
    assert f"podman save --format oci-archive -o {tmp_path / 'out' / 'worker.tar'}" in calls

    # Warm: the base is not made again.
    (tmp_path / "calls").unlink()
    shutil.rmtree(tmp_path / "bin")
    code, output, calls = make_images(tmp_path, engines, {"DATAGEN_IMAGES_CACHE": str(tmp_path / "cache")})
    assert code == 0, output
    assert "mmdebstrap" not in calls and len(builds(calls)) == 2
    assert " save " not in calls, calls  # the same images: their archives are kept


def test_an_explicit_engine_is_used_and_never_swapped_for_another(tmp_path: Path) -> None:
    code, output, calls = make_images(tmp_path, {"docker": WORKS, "podman": WORKS}, {"CONTAINER_ENGINE": "podman"})
    assert code == 0, output
    assert builds(calls) == expected_builds("podman")

    broken = tmp_path / "broken"
    broken.mkdir()
    code, output, calls = make_images(broken, {"docker": WORKS, "podman": BROKEN}, {"CONTAINER_ENGINE": "podman"})
    assert code != 0
    assert "CONTAINER_ENGINE=podman does not work here" in output, output
    assert builds(calls) == []


def test_registry_and_tag_can_be_overridden(tmp_path: Path) -> None:
    code, output, calls = make_images(
        tmp_path, {"docker": WORKS}, {"IMAGE_REGISTRY": "registry.example/me", "IMAGE_TAG": "dev"}
    )
    assert code == 0, output
    assert builds(calls) == expected_builds("docker", "registry.example/me", "dev")


def test_push_sends_both_to_the_registry_and_writes_no_archives(tmp_path: Path) -> None:
    code, output, calls = make_images(tmp_path, {"docker": WORKS}, {"PUSH": "1"})
    assert code == 0, output
    tags = [f"ghcr.io/datagen-operator/{name}:{VERSION}" for name in ("operator", "datagen")]
    assert [line.strip() for line in calls.splitlines() if " push " in line] == [f"docker push {t}" for t in tags]
    assert " save " not in calls and not (tmp_path / "out").exists()
