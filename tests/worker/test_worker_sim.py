"""`datagen worker` against the SGLang simulator over real HTTP, with the real (stand-in) tokenizer.

Most runs are in-process (`main(argv)`, rendering inline) to keep the suite fast; crash and signal
tests that need a separate process are in test_worker_crash.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.manifest import read_manifest
from datagen_operator.output.readers import iter_records, iter_rejects, read_progress
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.pin import pin_dataset
from tests.harness.processes import wait_until
from tests.harness.sim import start_sim, start_sims
from tests.worker.simrun import (
    SIM_FLAGS,
    check_records,
    progress,
    prompts,
    raw_segment_keys,
    run_inprocess,
    spec,
    standin,
    write_dataset,
)

FAULTS = (
    "--sim-fault-5xx-rate", "0.15", "--sim-fault-reset-rate", "0.1", "--sim-fault-abort-rate", "0.1",
    "--sim-fault-hang-s", "1.5", "--sim-fault-hang-rate", "0.05", "--sim-seed", "3",
)  # fmt: skip
OVERLOADED = (
    "--sim-speed", "gpu", "--sim-tokens-per-s", "4000", "--sim-ttft-s", "0.02", "--sim-batch-capacity", "2",
    "--max-queued-requests", "2",
)  # fmt: skip
# Simulators with one behaviour each, started together (start-up overlaps) once for the module.
VARIANTS: dict[str, tuple[str, ...]] = {
    "plain": SIM_FLAGS,
    "faults": (*SIM_FLAGS, *FAULTS),
    "stream": (*SIM_FLAGS, "--incremental-streaming-output", "--sim-fault-stream-error-rate", "0.2", "--sim-seed", "5"),
    "unavailable": (*SIM_FLAGS, "--sim-fault-5xx-rate", "0.1", "--sim-fault-5xx-status", "503", "--sim-seed", "2"),
    # SGLang with --max-queued-requests under more load than it holds: 2 generating, 2 waiting, the rest shed.
    "queue_full": (*SIM_FLAGS, *OVERLOADED),
    "queue_full_stream": (*SIM_FLAGS, *OVERLOADED, "--incremental-streaming-output"),
    "broken": (*SIM_FLAGS, "--sim-fault-5xx-rate", "1"),
    # Every 4th request (by the simulator's count) refused with a 400, as SGLang refuses a bad request.
    "refuse_400": (*SIM_FLAGS, "--sim-fault-5xx-rate", "0.3", "--sim-fault-5xx-status", "400", "--sim-seed", "4"),
    "tp4": (*SIM_FLAGS, "--tp-size", "4"),
    "short_context": (*SIM_FLAGS, "--context-length", "65536"),
    "suffix_leak": (*SIM_FLAGS, "--sim-prompt-suffix-leak", "2"),
}


@pytest.fixture(scope="module")
def sims():
    with start_sims(list(VARIANTS.values()), tokenizer_dir=standin()) as servers:
        yield dict(zip(VARIANTS, servers, strict=True))


@pytest.fixture(scope="module")
def sim(sims):
    return sims["plain"]


def test_two_shards_record_every_prompt_once_in_dataset_order(tmp_path: Path, sim) -> None:
    items = prompts(40)
    bad = {
        3: b"{broken json",
        7: b'{"id": null, "messages": [{"role": "user", "content": "no id"}]}',
        11: orjson.dumps(items[2]),  # duplicate id p0002
        20: b'{"id": "empty", "messages": []}',
    }
    dataset = write_dataset(tmp_path / "prompts.jsonl", items, bad)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.shards": 2, "generation.samplesPerPrompt": 2})
    # One after the other, the first keeping to its own shard (it would take all of the other's chunks).
    assert run_inprocess(document, [sim.url], "--shard-index", "0", "--no-steal") == EXIT_OK
    assert run_inprocess(document, [sim.url], "--shard-index", "1") == EXIT_OK

    check_records(output, items, samples=2, servers={sim.url})
    # Parquet: one file per shard, int32 lists, rows in dataset order then sample, readable everywhere.
    layout = OutputLayout(output)
    positions = {item["id"]: i for i, item in enumerate(items)}
    for shard in (0, 1):
        table = pq.read_table(layout.parquet(shard, 2))
        assert str(table.schema.field("output_ids").type) == "list<element: int32>"
        keys = list(zip(table["id"].to_pylist(), table["sample"].to_pylist(), strict=True))
        assert keys == sorted(keys, key=lambda k: (positions[k[0]], k[1])) and len(keys) > 10
        assert layout.segments(shard) == []
    import datasets
    import pandas

    frame = pandas.read_parquet(layout.parquet(0, 2))
    dataset_hf = datasets.Dataset.from_parquet(str(layout.parquet(1, 2)), cache_dir=str(tmp_path / "hf"))
    assert len(frame) + dataset_hf.num_rows == 80
    assert json.loads(frame["finish_reason"][0])["type"] == "stop"

    # Malformed lines: set aside once (by the shard that owns them), counted, with reasons.
    rejects = list(iter_rejects(output))
    assert sorted(r["reason"].split(":")[0].split(" (")[0] for r in rejects) == [
        "bad JSON", "duplicate id 'p0002'", "empty or missing messages", "missing id"
    ]  # fmt: skip
    assert sum(p.malformed_lines for p in read_progress(output)) == 4
    # Lines are counted from 1 in rejects.jsonl as on the console: the 4th, 9th, 14th and 24th physical lines.
    assert sorted(r["line"] for r in rejects) == [4, 9, 14, 24]
    assert sorted(r["key"] for r in rejects) == ["line:14", "line:24", "line:4", "line:9"]

    manifest = read_manifest(output)
    assert manifest is not None and manifest["shard_count"] == 2
    assert manifest["counts"]["records"] == 80 and manifest["counts"]["shards_complete"] == 2
    assert manifest["fingerprint"]["thinking"] is True and manifest["fingerprint"]["preset"] == "kimi-k2.5"
    assert manifest["fingerprint"]["server"]["version"] and "port" not in manifest["fingerprint"]["server"]["args"]
    for shard in ("00000", "00001"):
        entry = manifest["shards"][shard]
        assert entry["state"] == "complete" and len(entry["parquet_sha256"]) == 64
    states = {p.shard: (p.state, p.records_done, p.records_total) for p in read_progress(output)}
    assert sum(done for _, done, _ in states.values()) == 80 and {s for s, _, _ in states.values()} == {"complete"}

    # A rerun of a complete shard does nothing and changes nothing.
    before = layout.parquet(0, 2).read_bytes()
    assert run_inprocess(document, [sim.url], "--shard-index", "0") == EXIT_OK
    assert layout.parquet(0, 2).read_bytes() == before


def test_faults_are_retried_until_every_record_is_good(tmp_path: Path, sims) -> None:
    items = prompts(40)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.requestTimeout": "500ms", "clients.maxAttempts": 30})
    assert run_inprocess(document, [sims["faults"].url]) == EXIT_OK
    records = check_records(output, items)
    errors = progress(output)["errors"]
    # SGLang answers a non-streaming abort with its error status (an ErrorResponse body, not a 200 carrying
    # finish_reason abort), so the simulator's aborts arrive here as HTTP 500s, retried like them.
    assert errors.get("http_500", 0) > 0, errors
    assert errors.get("timeout", 0) > 0, errors
    assert errors.get("connection_error", 0) + errors.get("server_down", 0) > 0, errors
    assert max(r["attempts"] for r in records) > 1


def test_streaming_joins_incremental_deltas_and_sets_aside_stream_errors(tmp_path: Path, sims) -> None:
    """SGLang's in-stream error is a request it refuses (`retryable: false`): set aside with its reason,
    never retried; every other prompt is joined from its deltas exactly once."""
    items = prompts(24)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    document = spec(dataset, tmp_path / "out", **{"generation.stream": True})
    assert run_inprocess(document, [sims["stream"].url]) == EXIT_OK
    rejected = {r["id"] for r in iter_rejects(tmp_path / "out")}
    # Recorded with the status the event carries (`code: 400`), as a non-streaming refusal would be.
    assert rejected and all(
        "stream error" in r["reason"] and r["status"] == 400 for r in iter_rejects(tmp_path / "out")
    )
    check_records(tmp_path / "out", [item for item in items if item["id"] not in rejected])
    assert progress(tmp_path / "out")["records_rejected"] == len(rejected)


def test_stream_requested_from_a_cumulative_server_falls_back_to_plain_requests(
    tmp_path: Path, sim, capsys: pytest.CaptureFixture[str]
) -> None:
    items = prompts(6)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    document = spec(dataset, tmp_path / "out", **{"generation.stream": True})
    assert run_inprocess(document, [sim.url]) == EXIT_OK
    check_records(tmp_path / "out", items)  # a cumulative stream joined as deltas would fail this
    assert "--incremental-streaming-output" in capsys.readouterr().err


def test_503_from_a_live_server_backs_off_without_spending_attempts(tmp_path: Path, sims) -> None:
    # One attempt per record: any 503 that counted as an attempt would leave the shard incomplete. The answer
    # carries SGLang's error envelope, so the server is alive: the endpoint is not paused (no outage).
    items = prompts(30)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    document = spec(dataset, tmp_path / "out", **{"clients.maxAttempts": 1})
    assert run_inprocess(document, [sims["unavailable"].url]) == EXIT_OK
    check_records(tmp_path / "out", items)
    errors = progress(tmp_path / "out")["errors"]
    assert errors.get("overloaded", 0) > 0 and "server_down" not in errors, errors


@pytest.mark.parametrize("variant", ["queue_full", "queue_full_stream"])
def test_a_full_server_queue_sheds_requests_that_wait_and_go_again(tmp_path: Path, sims, variant: str) -> None:
    # 16 in flight against a server that holds 4: SGLang aborts the rest with 503 "The request queue is full."
    # (an HTTP 503 without a stream, an abort chunk in a 200 stream). Every record once, no attempt spent
    # (maxAttempts 1), the endpoint never paused.
    items = prompts(40)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    overrides = {"clients.maxAttempts": 1, "clients.concurrency": 16, "generation.stream": variant.endswith("stream")}
    document = spec(dataset, tmp_path / "out", **overrides)
    assert run_inprocess(document, [sims[variant].url]) == EXIT_OK
    check_records(tmp_path / "out", items)
    errors = progress(tmp_path / "out")["errors"]
    assert errors.get("overloaded", 0) > 0 and "server_down" not in errors, errors


def test_exhausted_attempts_leave_the_shard_incomplete_and_a_rerun_finishes_it(tmp_path: Path, sims) -> None:
    items = prompts(12)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.maxAttempts": 2})
    assert run_inprocess(document, [sims["broken"].url]) == EXIT_INCOMPLETE
    state = progress(output)
    assert state["state"] == "incomplete" and state["records_failed"] == 12 and state["records_done"] == 0
    assert list(iter_rejects(output)) == []  # not permanent: nothing set aside
    assert run_inprocess(document, [sims["plain"].url]) == EXIT_OK
    check_records(output, items)


def test_server_400_goes_to_rejects_with_its_reason_and_is_not_retried(tmp_path: Path, sims) -> None:
    # An over-long prompt is set aside before sending (test_too_long.py); a 400 for any other reason
    # is the server's verdict on the record: kept with its reason, never retried.
    items = prompts(10, tools_every=0)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    # Greedy: the simulator samples each request anew (as SGLang does), and a sampled answer may pass 64 tokens.
    document = spec(dataset, output, **{"generation.sampling.max_new_tokens": 64, "generation.sampling.temperature": 0})
    server = sims["refuse_400"]
    assert run_inprocess(document, [server.url]) == EXIT_OK
    rejects = list(iter_rejects(output))
    assert rejects, "the simulator refused none: pick another --sim-seed"
    assert {(r["kind"], r["status"], r["attempts"]) for r in rejects} == {("server", 400, 1)}
    assert all("Simulated server error" in r["reason"] for r in rejects)
    refused = {r["id"] for r in rejects}
    check_records(output, [item for item in items if item["id"] not in refused])
    state = progress(output)
    assert (state["records_done"], state["records_rejected"], state["state"]) == (
        10 - len(refused),
        len(refused),
        "complete",
    )
    assert state["records_set_aside"] == 0
    # Resume does not send them again.
    assert run_inprocess(document, [server.url]) == EXIT_OK
    assert len(list(iter_rejects(output))) == len(rejects)


def test_resume_into_a_different_fingerprint_is_refused_naming_the_change(
    tmp_path: Path, sims, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sims["plain"]
    items = prompts(4)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    assert run_inprocess(spec(dataset, output), [sim.url]) == EXIT_OK
    manifest_before = (output / "manifest.json").read_bytes()

    other_sampling = spec(dataset, output, **{"generation.sampling.temperature": 0.9})
    assert run_inprocess(other_sampling, [sim.url]) == EXIT_FINGERPRINT_MISMATCH
    other_thinking = spec(dataset, output, **{"generation.thinking": False})
    assert run_inprocess(other_thinking, [sim.url]) == EXIT_FINGERPRINT_MISMATCH
    assert run_inprocess(spec(dataset, output), [sims["short_context"].url]) == EXIT_FINGERPRINT_MISMATCH
    assert run_inprocess(spec(dataset, output, **{"clients.shards": 2}), [sim.url], "--shard-index", "0") == (
        EXIT_FINGERPRINT_MISMATCH
    )
    text = capsys.readouterr().err
    assert "sampling.temperature: 0.6 -> 0.9" in text
    assert "thinking: true -> false" in text
    assert "server.args.context_length: null -> 65536" in text
    assert "sharded 1 ways" in text
    assert (output / "manifest.json").read_bytes() == manifest_before
    state = progress(output)  # the refusal is visible, the counters of the finished run are kept
    assert state["state"] == "failed" and "sharded 1 ways" in state["message"]  # the last refusal
    assert state["records_done"] == state["records_total"] == 4
    # Parallelism is not data: the same run resumes (nothing left to do) on a tp 4 server.
    assert run_inprocess(spec(dataset, output), [sims["tp4"].url]) == EXIT_OK


def test_requests_spread_over_endpoints_and_continue_when_one_goes_away(tmp_path: Path) -> None:
    items = prompts(60)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    # Paced (~0.1 s a request) so that the run is still going when one server goes away.
    paced = (*SIM_FLAGS, "--sim-speed", "gpu", "--sim-tokens-per-s", "400", "--sim-ttft-s", "0.01")
    with start_sims([paced, paced], tokenizer_dir=standin()) as (first, second):
        both = tmp_path / "both"
        assert run_inprocess(spec(dataset, both), [first.url, second.url]) == EXIT_OK
        served = [r["server"] for r in check_records(both, items, servers={first.url, second.url})]
        assert min(served.count(first.url), served.count(second.url)) >= 15  # equal servers share the work

        one_left = tmp_path / "one-left"

        def stop_second_mid_run() -> None:
            layout = OutputLayout(one_left)
            # the first records are on disk: the run is under way
            wait_until(
                lambda: layout.shard_dir(0).is_dir() and layout.segments(0), timeout=60,
                describe="the first records", interval=0.002,
            )  # fmt: skip
            second.stop()

        stopper = threading.Thread(target=stop_second_mid_run)
        stopper.start()
        try:
            document = spec(dataset, one_left, **{"clients.maxAttempts": 2})
            assert run_inprocess(document, [first.url, second.url]) == EXIT_OK
        finally:
            stopper.join()
        records = check_records(one_left, items, servers={first.url, second.url})
    assert progress(one_left)["errors"].get("server_down", 0) > 0  # it noticed, paused that endpoint
    assert {r["server"] for r in records} == {first.url, second.url}
    assert progress(one_left)["servers_up"] == 1


def test_server_crash_and_restart_mid_run_loses_nothing_and_spends_no_attempts(tmp_path: Path) -> None:
    items = prompts(50)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"clients.maxAttempts": 1})
    with start_sim(*SIM_FLAGS, "--sim-crash-after-requests", "30", tokenizer_dir=standin()) as server:
        restarts: list[int] = []
        stop = threading.Event()

        def nurse() -> None:  # what a Deployment would do: restart the crashed server on the same port
            while not stop.is_set():
                if not server.running and len(restarts) < 5:
                    restarts.append(server.returncode or 0)
                    server.restart()
                time.sleep(0.05)

        watcher = threading.Thread(target=nurse)
        watcher.start()
        try:
            assert run_inprocess(document, [server.url]) == EXIT_OK
        finally:
            stop.set()
            watcher.join()
    assert restarts and restarts[0] == 1, "the server should have crashed at least once"
    check_records(output, items)
    assert progress(output)["errors"].get("server_down", 0) > 0


def test_no_server_answering_exits_with_its_own_code(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(2))
    document = spec(dataset, tmp_path / "out")
    started = time.monotonic()
    assert run_inprocess(document, [dead], "--server-timeout", "1.5") == EXIT_SERVER_UNREACHABLE
    assert time.monotonic() - started < 30


def test_bad_input_exits_with_its_own_code(tmp_path: Path, sim) -> None:
    dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(2))
    assert run_inprocess(spec(tmp_path / "missing.jsonl", tmp_path / "out"), [sim.url]) == EXIT_BAD_INPUT
    broken = spec(dataset, tmp_path / "out")
    broken["generation"]["sampling"]["max_tokens"] = 5
    assert run_inprocess(broken, [sim.url]) == EXIT_BAD_INPUT
    assert run_inprocess(spec(dataset, tmp_path / "out", **{"model.path": str(tmp_path)}), [sim.url]) == (
        EXIT_BAD_INPUT
    )
    assert not list(iter_records(tmp_path / "out"))


def test_a_worker_without_a_pin_pins_the_dataset_as_it_plans_it_and_holds_a_rerun_to_it(
    tmp_path: Path, sim, monkeypatch
) -> None:
    """No preflight: the plan's read pins the dataset (every line, the bad ones too), written when the read ends;
    a rerun on an edited dataset is refused at start naming the line (exit 2), and a pin another shard wrote
    while this one read that disagrees with its read stops the shard before it completes."""
    import datagen_operator.worker.main as worker_main
    from datagen_operator.prompts.pin import read_pin, write_pin

    items = prompts(30)
    bad_lines = {4: b"{broken json", 9: b""}
    dataset = write_dataset(tmp_path / "prompts.jsonl", items, bad_lines)
    output = tmp_path / "out"
    assert run_inprocess(spec(dataset, output), [sim.url]) == EXIT_OK
    pinned, expected = read_pin(output), pin_dataset(DatasetRef(dataset))
    assert pinned is not None and pinned.summary() == expected.summary() and pinned.lines == 32
    assert pinned.line_hashes.tolist() == expected.line_hashes.tolist()
    check_records(output, items)

    edited = [*items[:6], {**items[6], "messages": [{"role": "user", "content": "edited?"}]}, *items[7:]]
    write_dataset(dataset, edited, bad_lines)
    assert run_inprocess(spec(dataset, output), [sim.url]) == EXIT_BAD_INPUT
    assert "1 line edited (line 8 (id 'p0006'))" in progress(output)["message"]

    other = tmp_path / "other"
    pin_while_read = worker_main.pin_while_read

    def pinned_meanwhile(*args: object) -> None:
        write_pin(other, pinned)  # another shard's pin, of the dataset before the edit
        pin_while_read(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_main, "pin_while_read", pinned_meanwhile)
    assert run_inprocess(spec(dataset, other), [sim.url]) == EXIT_BAD_INPUT
    assert "1 line edited (line 8 (id 'p0006'))" in progress(other)["message"]
    assert read_pin(other).sha256 == pinned.sha256  # the other shard's pin kept


def test_inline_flags_are_counted_from_the_shared_checks(tmp_path: Path, sims) -> None:
    # A server with the upstream prompt-suffix bug: output_ids carry prompt tokens not in completion_tokens.
    items = prompts(8)
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    assert run_inprocess(spec(dataset, output), [sims["suffix_leak"].url]) == EXIT_OK
    records = list(iter_records(output))
    assert all({"token_count_mismatch", "prompt_suffix_leak"} <= set(r["flags"]) for r in records)
    counts = progress(output)["flags"]
    assert counts["token_count_mismatch"] == counts["prompt_suffix_leak"] == 8
    assert read_manifest(output)["shards"]["00000"]["flags"]["token_count_mismatch"] == 8
    assert raw_segment_keys(output) == {}  # compacted: segments gone


def test_parquet_dataset_and_more_samples_later_extend_the_same_output(tmp_path: Path, sim) -> None:
    import pyarrow as pa

    items = prompts(8)
    table = pa.table(
        {
            "id": [item["id"] for item in items],
            "messages": [item["messages"] for item in items],
            "tools": [json.dumps(item["tools"]) if item.get("tools") else None for item in items],
        }
    )
    dataset = tmp_path / "prompts.parquet"
    pq.write_table(table, dataset)
    output = tmp_path / "out"
    assert run_inprocess(spec(dataset, output), [sim.url]) == EXIT_OK
    check_records(output, items)
    assert run_inprocess(spec(dataset, output, **{"generation.samplesPerPrompt": 3}), [sim.url]) == EXIT_OK
    check_records(output, items, samples=3)
    table = pq.read_table(OutputLayout(output).parquet(0, 1))
    assert table["sample"].to_pylist()[:3] == [0, 1, 2]  # merged into dataset order, samples together
