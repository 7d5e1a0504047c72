"""Issue 32 item 3 end to end: a server whose KV pool holds less than prompt + max_new_tokens (the simulator's
`--sim-kv-capacity`, capping as SGLang's scheduler does). The worker reads the pool from /server_info and sets
such prompts aside before sending, naming the pool, not the context; where the server cuts answers anyway (a
pool the worker was not told of), the records are flagged `truncated_by_memory` and verify's truncation verdict
names memory, not max_new_tokens, as the fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
from aiohttp import web

from datagen_operator.api import load_run
from datagen_operator.api.flags import TRUNCATED, TRUNCATED_BY_MEMORY
from datagen_operator.checks.evaluate import TRUNCATION
from datagen_operator.output.readers import iter_records
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.verify import verify_output
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sim
from tests.manifests import local_run, write_run
from tests.programs import one_shard_worker, run_program
from tests.worker.proxy import CountingProxy

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "examples" / "prompts" / "quickstart.jsonl"
SHORT_PROMPTS = 16
"""quickstart.jsonl's first 16 lines: prompts far shorter than the pool (its long-* prompts exceed it alone)."""
SIM = ("--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "8000")
"""Reasoning far past the 600-token pool: every answer is cut by it (a mean of 2,000, sampled anew, ended one answer
3 tokens short of the pool's cut in a CI run)."""


class ServerInfoProxy(CountingProxy):
    """Forwards to the simulator, but /server_info reports a KV pool of `pool` tokens (and the input bound of
    a context-bound server) instead of the simulator's own."""

    def __init__(self, upstream: str, pool: int) -> None:
        super().__init__(upstream)
        self.pool = pool

    async def _handle(self, request: web.Request) -> web.Response:
        reply = await super()._handle(request)
        if request.path != "/server_info" or reply.body is None:
            return reply
        info = orjson.loads(bytes(reply.body))  # type: ignore[arg-type]
        info.update(max_total_num_tokens=self.pool, max_req_input_len=info["context_length"] or 262138)
        return web.Response(status=reply.status, body=orjson.dumps(info), content_type="application/json")


def _dataset(tmp_path: Path) -> Path:
    path = tmp_path / "short.jsonl"
    path.write_bytes(b"".join(PROMPTS.read_bytes().splitlines(keepends=True)[:SHORT_PROMPTS]))
    return path


def _worker(run_file: Path, output: Path, url: str) -> subprocess.CompletedProcess[str]:
    return run_program(one_shard_worker(run_file, output, url))


def test_prompts_the_kv_pool_would_cut_are_set_aside_naming_the_pool(tmp_path: Path) -> None:
    standin = ensure_standin_tokenizer()
    run_file = tmp_path / "run.yaml"
    changes = {"generation": {"sampling": {"max_new_tokens": 4096}}, "clients": {"shards": 1, "concurrency": 8}}
    write_run(run_file, local_run(standin, _dataset(tmp_path), tmp_path / "out", name="m", **changes))
    with start_sim(*SIM, "--sim-kv-capacity", "600") as sim:
        worker = _worker(run_file, tmp_path / "out", sim.url)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert not list(iter_records(tmp_path / "out"))
    rejects = [orjson.loads(line) for line in (tmp_path / "out/shards/00000/rejects.jsonl").read_bytes().splitlines()]
    assert len(rejects) == SHORT_PROMPTS and {r["cause"] for r in rejects} == {"too_long"}
    assert all("exceeds the server's KV pool of 600 tokens (max_total_num_tokens" in r["reason"] for r in rejects), (
        rejects[0]["reason"]
    )


def test_answers_cut_by_the_kv_pool_are_named_as_memory(tmp_path: Path) -> None:
    """The worker told of a larger pool than the one that cuts (a proxy rewriting /server_info stands for a
    replica that reports another's figure): every answer ends `length` short of max_new_tokens."""
    standin = ensure_standin_tokenizer()
    run_file = tmp_path / "run.yaml"
    changes = {"generation": {"sampling": {"max_new_tokens": 4096}}, "clients": {"shards": 1, "concurrency": 8}}
    write_run(run_file, local_run(standin, _dataset(tmp_path), tmp_path / "out", name="m", **changes))
    with start_sim(*SIM, "--sim-kv-capacity", "600") as sim, ServerInfoProxy(sim.url, 900_000) as proxy:
        worker = _worker(run_file, tmp_path / "out", proxy.url)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    stored = list(iter_records(tmp_path / "out"))
    rejects = tmp_path / "out/shards/00000/rejects.jsonl"
    assert len(stored) == SHORT_PROMPTS, rejects.read_text() if rejects.exists() else worker.stdout[-2000:]
    for record in stored:
        assert len(record["output_ids"]) == 600 - len(record["input_ids"]) - 2 < 4096
        assert {TRUNCATED, TRUNCATED_BY_MEMORY} <= set(record["flags"]), record["flags"]
    spec = load_run(run_file).spec
    tokenizer = load_tokenizer(spec.model.path, trust_remote_code=False)
    report = verify_output(tmp_path / "out", spec, tokenizer=tokenizer, dataset=_dataset(tmp_path))
    check = next(c for c in report.checks if c.name == TRUNCATION)
    assert not check.passed and check.count == SHORT_PROMPTS
    assert check.verdict.startswith("16/16 outputs ended `length`, 16 of them short of max_new_tokens"), check.verdict
    assert "more KV memory" in check.verdict and "raising max_new_tokens cannot help" in check.verdict
