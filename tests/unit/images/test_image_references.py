"""The chart and the Dockerfiles describe the same two images: the repositories the chart pulls are the ones the
Dockerfiles say they build (and `make images` tags, tests/unit/images/test_make_images.py), the labels name the
chart's source and the package's licence, and the image's user is the one the chart and the operator's pods
run as (tests/images runs the built images that way)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from datagen_operator.k8s.pod_parts import WORKER_UID

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "datagen-operator"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# Dockerfile -> the chart's values key of the image it builds
IMAGES = {"operator": "image", "worker": "workerImage"}


def dockerfile(name: str) -> str:
    return (REPO / "images" / f"Dockerfile.{name}").read_text()


def labels(text: str) -> dict[str, str]:
    final_stage = text.rsplit("\nFROM ", 1)[1]
    return dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', final_stage))


@pytest.mark.parametrize("name", IMAGES)
def test_the_dockerfile_builds_the_image_the_chart_pulls(name: str) -> None:
    text = dockerfile(name)
    built = re.search(r"docker build -f images/Dockerfile\.\w+ -t (\S+):(\S+) \.", text)
    assert built, f"images/Dockerfile.{name} names no `docker build ... -t <image>` line"
    assert built.groups() == (VALUES[IMAGES[name]]["repository"], CHART_META["appVersion"])
    assert CHART_META["appVersion"] == PROJECT["version"]


@pytest.mark.parametrize("name", IMAGES)
def test_the_labels_name_the_charts_source_and_the_packages_licence(name: str) -> None:
    found = labels(dockerfile(name))
    assert found["org.opencontainers.image.source"] == CHART_META["home"] == CHART_META["sources"][0]
    assert found["org.opencontainers.image.licenses"] == PROJECT["license"]
    assert found["org.opencontainers.image.version"] == "${VERSION}"  # make images passes pyproject's version


@pytest.mark.parametrize("name", IMAGES)
def test_the_image_user_is_the_one_the_pods_run_as(name: str) -> None:
    user = re.findall(r"^USER (\S+)$", dockerfile(name), re.MULTILINE)
    assert user == [f"{WORKER_UID}:{WORKER_UID}"]
    assert (VALUES["podSecurityContext"]["runAsUser"], VALUES["podSecurityContext"]["runAsGroup"]) == (
        WORKER_UID, WORKER_UID
    )  # fmt: skip
    assert VALUES["securityContext"]["readOnlyRootFilesystem"] is True
