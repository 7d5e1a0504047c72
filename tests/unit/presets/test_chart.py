"""The chart and images, without helm: versions follow the package, the CRD is the generated file (a
symlink, never a copy), the chart's defaults match the operator's, and the image pins are exact."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

import datagen_operator
from datagen_operator.k8s.settings import DEFAULT_WORKER_IMAGE

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "datagen-operator"
IMAGES = ROOT / "images"


def test_chart_version_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == datagen_operator.__version__, "bump charts/datagen-operator/Chart.yaml appVersion"
    assert chart["version"] == datagen_operator.__version__, "bump charts/datagen-operator/Chart.yaml version"
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == datagen_operator.__version__


def test_chart_crd_is_a_link_to_the_generated_file() -> None:
    link = CHART / "crds" / "datagenrun.yaml"
    assert link.is_symlink(), "charts/datagen-operator/crds/datagenrun.yaml must stay a symlink (no copy that drifts)"
    assert link.resolve() == (ROOT / "crds" / "datagenrun.yaml").resolve()
    assert yaml.safe_load(link.read_text())["metadata"]["name"] == "datagenruns.datagen.dev"


def test_default_worker_image_is_the_operators_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    worker = values["workerImage"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{worker['repository']}:{worker['tag'] or chart['appVersion']}" == DEFAULT_WORKER_IMAGE


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (IMAGES / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert re.fullmatch(r"[a-z0-9-]+", name) and version, f"not an exact, canonical pin: {line!r}"
            pins[name] = version
    return pins


def test_the_sglang_extra_pins_the_sglang_the_project_tests_against() -> None:
    from datagen_operator.presets.sglang_names import PINNED_SGLANG_VERSION

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["sglang"] == [f"sglang=={PINNED_SGLANG_VERSION}"]


def test_image_pins_are_exact_and_satisfy_pyproject() -> None:
    pins = _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"images/requirements.txt lacks {name}: run `.venv/bin/python images/pin.py`"
        assert Version(pins[name]) in requirement.specifier, f"{name}=={pins[name]} is outside {line!r}"


def test_dockerfiles_pinned_multistage_non_root() -> None:
    for name in ("Dockerfile.operator", "Dockerfile.worker"):
        text = (IMAGES / name).read_text()
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
        assert base and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), f"{name}: pin the slim base"
        stages = re.split(r"^FROM ", text, flags=re.M)[1:]
        assert len(stages) == 2 and stages[0].startswith("${PYTHON_IMAGE} AS build"), f"{name}: build + final"
        final = stages[1]
        assert re.search(r"^USER 10001:10001$", final, re.M), f"{name}: run as the numeric non-root user"
        assert "COPY --from=build /opt/datagen /opt/datagen" in final
        # Nothing is compiled or installed in the final stage: no package manager, no pip install.
        assert not re.search(r"apt-get|apk |pip install|gcc|build-essential", final), f"{name}: tools in final stage"
        assert "--only-binary=:all:" in stages[0] and "-r /tmp/requirements.txt" in stages[0]
        assert (IMAGES / f"{name}.dockerignore").is_file()
