"""Progress sinks: the per-shard ConfigMap patch (against a fake API server over real HTTP) and /metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from datagen_operator.api.progress import ShardProgress
from datagen_operator.worker.metrics import serve_metrics
from datagen_operator.worker.progress import ConfigMapSink, JsonLogFormatter, Tracker


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _snapshot() -> ShardProgress:
    tracker = Tracker(ShardProgress(shard=3, shard_count=8, state="running", records_total=10))
    tracker.progress.counts.add(5, 7, 0, frozenset({"truncated"}), False)
    tracker.on_retry("http_500")
    return tracker.snapshot()


async def _fake_apiserver(requests: list[dict[str, Any]], status: int) -> tuple[web.AppRunner, int]:
    async def patch(request: web.Request) -> web.Response:
        requests.append(
            {
                "path": request.path,
                "content_type": request.headers.get("Content-Type"),
                "body": orjson.loads(await request.read()),
            }
        )
        if status != 200:
            return web.json_response({"kind": "Status", "code": status, "reason": "Forbidden"}, status=status)
        name = request.match_info["name"]
        return web.json_response({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})

    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{namespace}/configmaps/{name}", patch)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: runs}}}}]
current-context: x
"""
    )
    return path


def test_configmap_patch_carries_the_progress_json_and_is_rate_limited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[dict[str, Any]]:
        requests: list[dict[str, Any]] = []
        runner, port = await _fake_apiserver(requests, 200)
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", port)))
        sink = ConfigMapSink("run-shard-3", "runs", min_interval_s=60)
        try:
            assert await sink.write(_snapshot())
            assert not await sink.write(_snapshot())  # inside the interval: no request
            assert await sink.write(_snapshot(), force=True)  # the final snapshot always goes out
        finally:
            await sink.close()
            await runner.cleanup()
        return requests

    requests = asyncio.run(scenario())
    assert len(requests) == 2
    first = requests[0]
    assert first["path"] == "/api/v1/namespaces/runs/configmaps/run-shard-3"
    assert "patch" in (first["content_type"] or "")
    assert set(first["body"]) == {"data"} and set(first["body"]["data"]) == {"progress.json"}
    progress = ShardProgress.from_storage(first["body"]["data"]["progress.json"])
    assert progress.shard == 3 and progress.records_done == 1 and progress.counts.flags == {"truncated": 1}


def test_a_forbidden_patch_is_logged_once_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> list[bool]:
        requests: list[dict[str, Any]] = []
        runner, port = await _fake_apiserver(requests, 403)
        monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", port)))
        sink = ConfigMapSink("run-shard-3", "runs", min_interval_s=0)
        try:
            return [await sink.write(_snapshot()) for _ in range(3)]
        finally:
            await sink.close()
            await runner.cleanup()

    logger = logging.getLogger("datagen")
    logger.propagate = True
    with caplog.at_level(logging.WARNING, logger="datagen.worker.progress"):
        results = asyncio.run(scenario())
    assert results == [False, False, False]
    # Once, although three patches failed (a record may reach the capture through two handlers).
    assert len({r.created for r in caplog.records if "cannot patch ConfigMap" in r.getMessage()}) == 1


def test_metrics_endpoint_serves_the_snapshot() -> None:
    port = _free_port()
    snapshot = _snapshot()
    serve_metrics(port, lambda: snapshot, addr="127.0.0.1")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'datagen_worker_records_total{shard="3"} 1.0' in text
    assert 'datagen_worker_output_tokens_total{shard="3"} 7.0' in text
    assert 'datagen_worker_flags_total{flag="truncated",shard="3"} 1.0' in text
    assert 'datagen_worker_errors_total{kind="http_500",shard="3"} 1.0' in text
    assert 'datagen_worker_records_expected{shard="3"} 10.0' in text
    assert 'datagen_worker_state{shard="3",state="running"} 1.0' in text


def test_json_log_lines_carry_fields() -> None:
    record = logging.LogRecord("datagen.worker", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    record.fields = {"shard": 2}
    line = orjson.loads(JsonLogFormatter().format(record))
    assert line["msg"] == "hello x" and line["shard"] == 2 and line["level"] == "info"


def test_display_bar_on_a_terminal_and_log_lines_otherwise(caplog: pytest.LogCaptureFixture) -> None:
    from datagen_operator.worker.progress import Display

    snapshot = _snapshot()
    bar = Display(tty=True)
    bar.update(snapshot)
    snapshot.records_done = 10
    bar.close(snapshot)
    logging.getLogger("datagen").propagate = True
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="datagen.worker.progress"):
        plain = Display(tty=False, log_interval_s=3600)
        plain.update(snapshot)
        plain.update(snapshot)  # inside the interval: no second line
    lines = [r for r in caplog.records if r.getMessage().startswith("shard 3/8")]
    assert len({r.created for r in lines}) == 1 and lines[0].fields["records_done"] == 10  # type: ignore[attr-defined]


def test_worker_patches_its_own_shard_configmap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tests.harness.sim import start_sim
    from tests.worker.simrun import SIM_FLAGS, prompts, run_inprocess, spec, standin, write_dataset

    requests: list[dict[str, Any]] = []
    ready = threading.Event()
    stop: asyncio.Future[None] | None = None
    loop = asyncio.new_event_loop()
    port_box: list[int] = []

    def serve() -> None:
        nonlocal stop
        asyncio.set_event_loop(loop)
        runner, port = loop.run_until_complete(_fake_apiserver(requests, 200))
        port_box.append(port)
        stop = loop.create_future()
        ready.set()
        loop.run_until_complete(stop)
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "kubeconfig", port_box[0])))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        dataset = write_dataset(tmp_path / "prompts.jsonl", prompts(6))
        document = spec(dataset, tmp_path / "out", **{"clients.shards": 2})
        with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
            code = run_inprocess(
                document, [server.url], "--shard-index", "1", "--progress-configmap", "demo-shard-{index}",
                "--progress-namespace", "team-a",
            )  # fmt: skip
        assert code == 0
    finally:
        loop.call_soon_threadsafe(lambda: stop is not None and not stop.done() and stop.set_result(None))
        thread.join(10)
    paths = {r["path"] for r in requests}
    assert paths == {"/api/v1/namespaces/team-a/configmaps/demo-shard-1"}
    last = ShardProgress.from_storage(requests[-1]["body"]["data"]["progress.json"])
    assert last.state == "complete" and last.shard == 1 and last.records_done == last.records_total > 0
