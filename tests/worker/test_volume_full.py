"""The output volume fills up mid-run (a real size-limited filesystem, tests/worker/volume.py).

The worker must stop its requests at once (the server generates no more answers than were in flight),
keep every whole record, exit 7 with the cause in plain words, leave true progress/manifest files and no
temporaries, and resume to a complete, exactly-once output once the volume has room again.
"""

from __future__ import annotations

import os
import re
import urllib.request
from pathlib import Path

import orjson
import pytest

from datagen_operator.api.exit_codes import EXIT_OK, EXIT_OUTPUT_VOLUME
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records
from datagen_operator.output.volume import PartialFlush
from datagen_operator.output.writer import RESERVE_BYTES, ShardWriter
from tests.harness.sim import start_sim
from tests.worker.simrun import (
    SIM_FLAGS,
    check_records,
    progress,
    prompts,
    raw_segment_keys,
    spawn,
    spec,
    standin,
    write_dataset,
)
from tests.worker.volume import Volume

CONCURRENCY = 8
# Each request takes >= 0.2 s (>= 20 tokens at 100 tokens/s), the worker's flush interval: a lane cannot
# finish more than one answer between two flushes, so at the failure at most CONCURRENCY answers sit in
# the buffer and CONCURRENCY are on the wire.
PACED = ("--sim-speed", "gpu", "--sim-ttft-s", "0.01", "--sim-tokens-per-s", "100", "--enable-metrics")


def generated_answers(url: str) -> int:
    """The server's own count of finished generation requests (SGLang's `sglang:num_requests_total`)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert match, text[:2000]
    return int(float(match[1]))


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp") or p.name == ".reserve")


def test_a_partial_flush_keeps_whole_records_and_cuts_the_torn_one(small_volume: Volume) -> None:
    layout = OutputLayout(small_volume.root / "out")
    writer = ShardWriter(layout, 0)
    writer.recover()
    small_volume.leave_free(64 * 1024)
    record = {"id": "p", "input_ids": list(range(100_000, 100_050)), "output_ids": list(range(200_000, 200_400)),
              "cached_tokens": 0, "flags": []}  # fmt: skip
    for sample in range(400):  # ~3 KiB a line: more than is free
        writer.append({**record, "sample": sample})
    with pytest.raises(PartialFlush) as failure:
        writer.flush()
    writer.abort()
    kept = raw_segment_keys(layout.root)  # parses every line: a torn one would raise
    assert failure.value.errno == 28 and 0 < len(kept) < 400
    assert failure.value.unwritten == 400 - len(kept)
    assert writer.done == set(kept) and writer.written.records == len(kept)
    assert layout.segments(0)[0].read_bytes().endswith(b"\n")


def test_volume_full_stops_within_the_requests_in_flight_then_resumes_exactly_once(
    tmp_path: Path, small_volume: Volume
) -> None:
    items = prompts(300)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = small_volume.root / "out"
    layout = OutputLayout(output)
    document = spec(dataset, output, **{"clients.concurrency": CONCURRENCY})
    log = tmp_path / "worker.log"  # off the volume, as a cluster's stderr is
    # The reserve, manifest and progress pages, and room for about a third of the ~600-byte records.
    small_volume.leave_free(RESERVE_BYTES + 16 * 1024 + 64 * 1024)

    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        worker = spawn(document, [server.url], "--render-processes", "0", log=log)
        code = worker.wait(timeout=120)
        text = log.read_text()
        assert code == EXIT_OUTPUT_VOLUME, text[-3000:]

        kept = raw_segment_keys(output)  # every line parses: no torn record is left
        assert all(n == 1 for n in kept.values())
        assert 0 < len(kept) < 300
        for segment in layout.segments(0):
            assert segment.read_bytes().endswith(b"\n")
        generated = generated_answers(server.url)
        wasted = generated - len(kept)
        print(f"volume full after {len(kept)}/300 records; server answers {generated}, thrown away {wasted}")
        # Before the fix every answer of the shard was generated (300, 44 % thrown away).
        # No request goes out once the volume is known full (below the margin the requests in flight need, or a
        # failed write): what the server made beyond what was kept is at most the requests in flight then.
        assert wasted <= CONCURRENCY, (generated, len(kept))
        assert generated < 300

        # The cause in plain words: stderr first, then a true progress.json and manifest entry.
        assert "OutputVolumeFull: " in text and "bytes free after" in text
        # Known full before a write failed (the free space below the margin), or by the failed write itself.
        assert "no new request was sent" in text or "No space left on device" in text, text[-3000:]
        # The requests abandoned at once leave no asyncio noise ("exception was never retrieved", a traceback).
        assert "never retrieved" not in text and "Traceback" not in text, text[-3000:]
        snapshot = progress(output)
        assert snapshot["state"] == "failed" and snapshot["failure_reason"] == "OutputVolumeFull"
        assert snapshot["records_done"] == len(kept) and snapshot["in_flight"] == 0
        assert snapshot["message"].startswith(f"{output} has ")
        assert f"after {len(kept)}/300 records" in snapshot["message"]
        assert snapshot["records_unwritten"] <= wasted
        entry = orjson.loads(layout.manifest.read_bytes())["shards"]["00000"]
        assert entry["state"] == "failed" and entry["counts"]["records"] == len(kept)
        assert leftovers(small_volume.root) == []

        # Fix the volume, run the same command: the rest, once each.
        small_volume.grow()
        worker = spawn(document, [server.url], "--render-processes", "0", log=log)
        code = worker.wait(timeout=120)
        assert code == EXIT_OK, log.read_text()[-3000:]
        assert generated_answers(server.url) - generated == 300 - len(kept)  # nothing kept is generated again
    check_records(output, items)
    assert len(list(iter_records(output))) == 300
    assert progress(output)["state"] == "complete" and progress(output)["failure_reason"] == ""
    assert leftovers(small_volume.root) == []


def test_a_shard_that_finds_the_volume_full_stops_the_other_shards_requests(
    tmp_path: Path, small_volume: Volume
) -> None:
    """Two shards on one volume (the field case: 71 answers finished on the server after the volume filled,
    against 32 in flight). Shard 0 fills it and gives back its reserve; shard 1, slower, must send no new
    request into that room: what its server finishes after shard 0 stopped is at most its requests in flight."""
    items = prompts(300)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = small_volume.root / "out"
    document = spec(dataset, output, **{"clients.shards": 2, "clients.concurrency": CONCURRENCY})
    # Both reserves, their progress and manifest pages, and room for about fifty records.
    small_volume.leave_free(2 * RESERVE_BYTES + 32 * 1024 + 32 * 1024)
    slow = ("--sim-speed", "gpu", "--sim-ttft-s", "0.01", "--sim-tokens-per-s", "40", "--enable-metrics")
    with (
        start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as fast_server,
        start_sim(*SIM_FLAGS, *slow, tokenizer_dir=standin()) as slow_server,
    ):
        first = spawn(document, [fast_server.url], "--shard-index", "0", "--no-steal", log=tmp_path / "shard0.log")
        second = spawn(document, [slow_server.url], "--shard-index", "1", "--no-steal", log=tmp_path / "shard1.log")
        try:
            assert first.wait(timeout=120) == EXIT_OUTPUT_VOLUME, (tmp_path / "shard0.log").read_text()[-3000:]
            finished_then = generated_answers(slow_server.url)
            assert second.wait(timeout=120) == EXIT_OUTPUT_VOLUME, (tmp_path / "shard1.log").read_text()[-3000:]
        finally:
            for worker in (first, second):
                if worker.poll() is None:
                    worker.kill()
        finished_after = generated_answers(slow_server.url) - finished_then
        kept = raw_segment_keys(output, 1)
    print(f"shard 1: {finished_after} answers finished after shard 0 stopped; {len(kept)} records kept")
    # Before the fix shard 1 went on into shard 0's freed reserve: every answer of its shard was generated.
    assert finished_after <= CONCURRENCY, finished_after
    assert 0 < len(kept) < 150
    snapshot = progress(output, 1)
    assert snapshot["state"] == "failed" and snapshot["failure_reason"] == "OutputVolumeFull"
    # Known full by shard 0's marker, by the free space below its own requests' margin, or by its own failed write.
    message = snapshot["message"]
    assert "no new request was sent" in message or "No space left on device" in message, message
    assert leftovers(small_volume.root) == []


def test_a_volume_without_room_for_the_reserve_fails_before_any_request(tmp_path: Path, small_volume: Volume) -> None:
    items = prompts(20)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = small_volume.root / "out"
    document = spec(dataset, output)
    log = tmp_path / "worker.log"
    small_volume.leave_free(32 * 1024)
    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        code = spawn(document, [server.url], "--render-processes", "0", log=log).wait(timeout=60)
        assert code == EXIT_OUTPUT_VOLUME, log.read_text()[-3000:]
        assert generated_answers(server.url) == 0
    assert "OutputVolumeFull: " in log.read_text()
    # Named as the operator names a shard's failure from its ConfigMap: the condition reads alike either way.
    assert "(shard 0 stopped)" in log.read_text()
    assert leftovers(small_volume.root) == []
    assert not os.path.exists(OutputLayout(output).reserve(0))
