"""One run, one worker image: an operator upgraded mid-run (a new Helm `workerImage`, so a new
DATAGEN_WORKER_IMAGE) leaves every pod of a run in flight on the image the run started with, the verification
included; only new runs get the new image."""

from __future__ import annotations

from pathlib import Path

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, new_name

OLD, NEW = "ghcr.io/datagen-operator/datagen:0.4.0", "ghcr.io/datagen-operator/datagen:0.5.0"


def datagen_images(runs: Runs, name: str) -> dict[str, str]:
    """Every Job's and pod's image of the run but the server's (SGLang): `Job/<name>` and `Pod/<name>`."""
    images = {
        f"Job/{job.metadata.name}": job.spec.template.spec.containers[0].image
        for job in runs.batch.list_namespaced_job(runs.namespace, label_selector=f"datagen.dev/run={name}").items
    }
    for pod in runs.core.list_namespaced_pod(runs.namespace, label_selector=f"datagen.dev/run={name}").items:
        if pod.metadata.labels.get("datagen.dev/component") != "server":
            images[f"Pod/{pod.metadata.name}"] = pod.spec.containers[0].image
    return images


def test_an_operator_upgrade_mid_run_keeps_every_pod_of_the_run_on_its_starting_image(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name, later = new_name("image"), new_name("later")
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim:
        handle = operator([sim.url], worker_image=OLD)
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        assert runs.get(name)["status"]["workerImage"] == OLD
        # The upgrade, while the workers write records: the verify Job is still to be made, by the new operator.
        handle.stop()
        operator([sim.url], worker_image=NEW)
        runs.create(cluster_run(later, data_dir, standin_tokenizer))
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
        runs.wait(later, "InputsVerified", "True", "Passed", timeout=90)

    images = datagen_images(runs, name)
    assert {f"Job/{name}-{step}" for step in ("preflight", "canary", "workers", "verify")} <= set(images), images
    assert any(key.startswith(f"Pod/{name}-verify") for key in images), images
    assert set(images.values()) == {OLD}, images
    assert runs.get(name)["status"]["workerImage"] == OLD
    # A run the upgraded operator starts is on its image.
    assert set(datagen_images(runs, later).values()) == {NEW}
    assert runs.get(later)["status"]["workerImage"] == NEW
