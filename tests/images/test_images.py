"""Smoke tests of the images `make images` built (dist/images): run as the chart's pods run them (the image's
non-root user, a read-only root filesystem, no capabilities, no privilege escalation, writable scratch only
where the pods mount an emptyDir), the operator image answers, and the worker image generates a run's shards
against a simulator on this host, whose records `datagen verify` on the host then passes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from datagen_operator import __version__
from datagen_operator.k8s.pod_parts import SCRATCH_HOME, WORKER_UID
from tests.harness.sim import SimServer, start_sim
from tests.manifests import local_run, write_run
from tests.worker.simrun import SIM_FLAGS, prompts, standin, write_dataset

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "dist" / "images"
ENGINE = str(BUILT / "engine")
REFS = dict(line.split("=", 1) for line in (BUILT / "refs").read_text().split())
CHART = REPO / "charts" / "datagen-operator"
# The chart's (values.yaml) and the operator's (k8s/pod_parts.py) container securityContext, as engine flags.
RESTRICTED = ["--user", f"{WORKER_UID}:{WORKER_UID}", "--read-only", "--cap-drop", "ALL",
              "--security-opt", "no-new-privileges"]  # fmt: skip


def engine(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return result


def run(image: str, *args: str, flags: tuple[str, ...] = ()) -> str:
    """`args` in a fresh container of `image` as the chart runs it; its output."""
    return engine("run", "--rm", *RESTRICTED, *flags, REFS[image], *args).stdout


def labels(image: str) -> dict[str, str]:
    config = json.loads(engine("image", "inspect", REFS[image]).stdout)[0]
    found: dict[str, str] = (config.get("Config") or {}).get("Labels") or config.get("Labels") or {}
    return found


def test_the_chart_names_the_images_built() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert REFS["operator"] == f"{values['image']['repository']}:{app_version}"
    assert REFS["worker"] == f"{values['workerImage']['repository']}:{app_version}"
    for image in ("operator", "worker"):
        assert labels(image)["org.opencontainers.image.version"] == app_version == __version__


def test_the_operator_image_answers_as_its_non_root_user() -> None:
    tmp = ("--tmpfs", "/tmp")  # the chart's emptyDir
    assert run("operator", "--version", flags=tmp).strip() == f"datagen-operator {__version__}"
    assert "usage: datagen operator" in run("operator", flags=tmp)  # the image's CMD: operator --help
    probe = (
        "import os\n"
        "try:\n    open('/written', 'w')\nexcept OSError as error:\n    print(os.getuid(), os.getgid(), error.strerror)\n"
        "open('/tmp/scratch', 'w').write('ok')\n"
    )
    assert run("operator", "-c", probe, flags=(*tmp, "--entrypoint", "python")).strip() == (
        f"{WORKER_UID} {WORKER_UID} Read-only file system"
    )


def test_the_final_stage_holds_the_venv_and_nothing_of_the_build() -> None:
    probe = (
        "import importlib.util, os, sys\n"
        "print(sys.prefix, [m for m in ('pip', 'setuptools', 'wheel') if importlib.util.find_spec(m)],"
        " [p for p in BUILD_ONLY if os.path.exists(p)])\n"
    ).replace("BUILD_ONLY", repr(("/opt/build", "/wheels", "/src", "/tmp/requirements.txt", "/usr/local/bin/pip")))
    for image in ("operator", "worker"):
        assert run(image, "-c", probe, flags=("--entrypoint", "/opt/datagen/bin/python")).split() == [
            "/opt/datagen", "[]", "[]"
        ]  # fmt: skip


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with start_sim(*SIM_FLAGS) as server:
        yield server


def test_the_worker_image_generates_shards_that_verify_passes(tmp_path: Path, sim: SimServer) -> None:
    # Everything the containers read or write lives under tmp_path, mounted at the same path (the host's
    # tokenizer cache under /root is not reachable by the image's user).
    model = Path(shutil.copytree(standin(), tmp_path / "model"))
    for path in [model, *model.rglob("*")]:  # readable by the image's user, as a model volume is
        path.chmod(0o755 if path.is_dir() else 0o644)
    items = prompts(12)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    output.mkdir(mode=0o777)
    output.chmod(0o777)  # the image's user writes it (the pods' fsGroup does this on a volume)
    document = local_run(model, dataset, output, **{"clients.shards": 2, "clients.concurrency": 4})
    run_file = write_run(tmp_path / "run.yaml", document)
    mounts = ["-v", f"{model}:{model}:ro", "-v", f"{dataset}:{dataset}:ro", "-v", f"{output}:{output}"]
    scratch = ["--tmpfs", f"{SCRATCH_HOME}:rw,mode=1777", "-e", f"HOME={SCRATCH_HOME}", "-e", f"TMPDIR={SCRATCH_HOME}"]
    container = [ENGINE, "run", "--rm", *RESTRICTED, "--network", "host", *mounts, *scratch]
    command = ["worker", "--spec-json", json.dumps(document["spec"]), "--output", str(output), "--server", sim.url]
    workers = [  # the two pods of the run's Indexed Job, in parallel
        subprocess.Popen(
            [*container, "-e", f"JOB_COMPLETION_INDEX={shard}", REFS["worker"], *command, "--log-format", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for shard in (0, 1)
    ]
    logs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], "\n".join(log[-3000:] for log in logs)

    verify = subprocess.run(
        [str(Path(sys.executable).with_name("datagen")), "verify", str(output), "--run", str(run_file), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    report = json.loads(verify.stdout)
    assert report["passed"] is True, verify.stdout[-3000:]
    assert report["records"] == len(items), verify.stdout[-3000:]
