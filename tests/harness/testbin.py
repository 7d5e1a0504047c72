"""The control-plane binaries: hack/testbin/build.sh builds them once into a version-keyed cache."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.processes import ControlPlaneError, tail

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "testbin" / "build.sh"
TESTBIN_BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "etcd",
    "kwok",
    "kubectl",
    "lws-manager",
    "kueue-manager",
)


class TestbinUnavailable(ControlPlaneError):
    """The binaries are not built and cannot be built here; the message says what to install."""

    __test__ = False  # not a test class, despite the name


def _testbin_complete(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in TESTBIN_BINARIES)


BUILD_LOG = Path(tempfile.gettempdir()) / "datagen-testbin-build.log"


def ensure_testbin() -> Path:
    """The folder holding the control-plane binaries, built by hack/testbin/build.sh when missing
    (its progress goes to BUILD_LOG). DATAGEN_TESTBIN_DIR points at a prebuilt folder instead."""
    override = os.environ.get("DATAGEN_TESTBIN_DIR")
    if override:
        directory = Path(override)
        if not _testbin_complete(directory):
            raise TestbinUnavailable(
                f"DATAGEN_TESTBIN_DIR={override} lacks one of {', '.join(TESTBIN_BINARIES)}; "
                "unset it to build them with `make testbin`"
            )
        return directory
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    with BUILD_LOG.open("w") as progress:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=progress, text=True
        )
    if result.returncode != 0:
        # The tail says what is wrong; with no Go (exit 3) build.sh says what to install.
        raise TestbinUnavailable(
            f"the test control plane is not built and {BUILD_SCRIPT.relative_to(REPO_ROOT)} failed "
            f"(exit {result.returncode}):\n{tail(BUILD_LOG.read_text(), 30)}\nThen run `make testbin`, "
            "or set DATAGEN_TEST_KUBECONFIG to run these tests against an existing cluster (docs/testing.md)."
        )
    return Path(result.stdout.strip().splitlines()[-1])
