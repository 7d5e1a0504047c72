"""The worker image a run started with is the one all its pods keep (pure): an operator upgrade mid-run must not
put the verification on another image than the workers that wrote the records."""

from __future__ import annotations

from typing import Any

from datagen_operator.api.status import DataGenRunStatus
from datagen_operator.k8s.job_manifests import started_worker_image

OLD, NEW, OWN = "ghcr.io/datagen-operator/datagen:0.4.0", "ghcr.io/datagen-operator/datagen:0.5.0", "me/datagen:1"


def job(name: str, image: str, created: str) -> dict[str, Any]:
    container = {"name": name, "image": image}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"template": {"spec": {"containers": [container]}}}}  # fmt: skip


def test_a_new_run_starts_on_the_operators_image_and_keeps_what_it_recorded() -> None:
    assert started_worker_image(None, [], None, NEW) == NEW
    # Recorded at its first pass: an operator upgraded since does not move it.
    assert started_worker_image(OLD, [job("r-workers", OLD, "2026-01-01T00:00:02Z")], None, NEW) == OLD


def test_a_run_an_older_operator_started_keeps_the_image_of_its_first_job() -> None:
    jobs = [job("r-verify", NEW, "2026-01-01T00:09:00Z"), job("r-preflight", OLD, "2026-01-01T00:00:01Z")]
    assert started_worker_image(None, jobs, None, NEW) == OLD
    # The Jobs ran the user's spec.clients.image: that says nothing of the operator's image.
    assert started_worker_image(None, [job("r-preflight", OWN, "2026-01-01T00:00:01Z")], OWN, NEW) == NEW


def test_the_recorded_image_is_kept_in_the_status() -> None:
    status = DataGenRunStatus(worker_image=OLD).model_dump(mode="json", by_alias=True, exclude_none=True)
    assert status == {"workerImage": OLD, "conditions": [], "checks": []}
    assert DataGenRunStatus.model_validate(status).worker_image == OLD
