"""One Counts from the worker to the run's status and `datagen verify`: the prompts a worker set aside, by cause,
reach status.progress (summed by control) and verify's report unchanged, apart from the server's refusals."""

from __future__ import annotations

from datagen_operator.control.progress import counters_from_snapshots, progress_of
from datagen_operator.output.readers import read_progress
from tests.checks.set_aside_output import SAMPLES, verify_produced
from tests.checks.test_verify_set_aside import EXPECTED_CAUSES


def test_set_aside_causes_counted_by_the_worker_reach_the_status_and_the_report(produced) -> None:
    document, dataset, output = produced
    snapshots = read_progress(output)
    worker = counters_from_snapshots(snapshots).counts
    assert worker.set_aside == EXPECTED_CAUSES

    status = progress_of(counters_from_snapshots(snapshots), len(snapshots), len(snapshots), samples=SAMPLES)
    assert status.set_aside == EXPECTED_CAUSES and status.refused == 0
    assert status.summary.endswith(", 5 set aside") and "refused" not in status.summary
    assert status.model_dump(mode="json")["setAside"] == EXPECTED_CAUSES

    report = verify_produced(document, dataset, output).counts
    assert report.set_aside == worker.set_aside
    # The same records and dataset lines, counted once by the worker as it went and once by verify from the files.
    assert (report.records, report.lines, report.refused) == (worker.records, worker.lines, worker.refused)
    assert (report.records, report.lines) == (12, 11)  # 6 prompts x 2 samples; 8 prompts and 3 malformed lines
