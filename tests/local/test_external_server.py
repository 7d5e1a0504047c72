"""`datagen run` on SGLang servers it does not own (server.external.urls): simulators started here, outside the run.
The run starts no server process and leaves them running; the parser check holds each one to the preset."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from datagen_operator.api.commands import VerifyCommand
from tests.harness.sim import health_status, start_sim, start_sims
from tests.local.runs import dataset_ids, manifest, stored_keys
from tests.manifests import DELETE
from tests.programs import run_program

KIMI = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2")
FAST = ("--sim-mean-reasoning-tokens", "48", "--sim-mean-answer-tokens", "32")
SERVER_PROGRAMS = ("sim-server", "sglang.launch_server")


def descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid`: its command line."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                try:
                    found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                frontier.append(child)
    return found


def run_watching_children(run_file: Path, timeout: float = 240) -> tuple[int, str, set[str]]:
    """`datagen run` in a child process: (exit code, its output, every command line its descendants ran)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "datagen_operator.cli", "run", str(run_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        seen |= set(descendants(process.pid).values())
        time.sleep(0.1)
    output, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    return process.returncode, output, seen


def test_a_run_on_external_servers_starts_none_and_leaves_them_running(tmp_path: Path, standin_tokenizer: Path) -> None:
    with start_sims([(*KIMI, *FAST), (*KIMI, *FAST)], tokenizer_dir=standin_tokenizer) as sims:
        urls = [sim.url for sim in sims]
        run_file = manifest(
            tmp_path,
            standin_tokenizer,
            **{"server.gpus": DELETE, "server.external": {"urls": [f"{urls[0]}/", urls[1]]}},
        )
        code, output, children = run_watching_children(run_file)
        assert code == 0, output
        # The run's own children were its workers (and no server program), and nothing was started for a server.
        workers = [line for line in children if " worker " in f" {line} "]
        servers = [line for line in children if any(program in line for program in SERVER_PROGRAMS)]
        assert len(workers) >= 2 and not servers, children
        out = tmp_path / "out"
        assert not list((out / "logs").glob("server-*")), "no server log: no server process"
        assert "server replica(s)" not in output
        # The preflight says which flags the server's deployer must have set, before the server is read.
        flags = "the external server must run with --reasoning-parser kimi_k2, --tool-call-parser kimi_k2"
        assert flags in output.split("ParsersVerified", 1)[0], output
        for said in ("ServerReady=True (ExternalServerReady)", "ParsersVerified=True", "CanaryPassed=True"):
            assert said in output, output
        assert f"external server {urls[0]}, {urls[1]} answers /health_generate" in output, output
        assert "the external server is no longer used and keeps running" in output, output
        assert "Succeeded=True" in output, output
        # Every record, from both servers, verified.
        assert sorted(stored_keys(out)) == sorted((i, 0) for i in dataset_ids())
        answered_by = {s for path in sorted((out / "data").glob("*.parquet")) for s in pq.read_table(path)["server"]}
        assert {str(s) for s in answered_by} == set(urls)
        verify = run_program(VerifyCommand(output=str(out), json=True))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert orjson.loads(verify.stdout)["passed"]
        # Still serving after the run ended: the run never stops a server it does not own.
        assert all(sim.running for sim in sims)
        assert [health_status(url) for url in urls] == [200, 200]


def test_an_external_server_without_the_reasoning_parser_is_refused_naming_it(
    tmp_path: Path, standin_tokenizer: Path
) -> None:
    with (
        start_sim(*KIMI, *FAST, tokenizer_dir=standin_tokenizer) as right,
        start_sim("--tool-call-parser", "kimi_k2", *FAST, tokenizer_dir=standin_tokenizer) as wrong,
    ):
        run_file = manifest(
            tmp_path, standin_tokenizer, **{"server.gpus": DELETE, "server.external": {"urls": [right.url, wrong.url]}}
        )
        code, output, _ = run_watching_children(run_file)
        assert code == 1, output
        assert "ParsersVerified=False" in output and "Succeeded=False (ParsersMismatch)" in output, output
        # The second server is the one named, with the flag its deployer must add.
        assert f"{wrong.url}: the server runs without --reasoning-parser" in output, output
        assert "launch it with --reasoning-parser kimi_k2" in output, output
        assert not list((tmp_path / "out").glob("shards/*/*.jsonl")), "no bulk record"
        assert right.running and wrong.running


def test_datagen_run_refuses_a_service_naming_the_field(tmp_path: Path, standin_tokenizer: Path) -> None:
    run_file = manifest(
        tmp_path,
        standin_tokenizer,
        **{"server.gpus": DELETE, "server.external": {"service": {"name": "sglang", "port": 80}}},
    )
    code, output, children = run_watching_children(run_file, timeout=60)
    assert code == 2, output
    assert "spec.server.external.service" in output and "spec.server.external.urls" in output, output
    assert not any(program in line for line in children for program in SERVER_PROGRAMS)
