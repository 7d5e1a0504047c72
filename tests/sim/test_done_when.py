"""Issue 4's "Done when", literally: the `datagen` command, a fixed port, real HTTP."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.processes import wait_until
from tests.harness.sim import health_status
from tests.sim.http import get, post
from tests.sim.prompts import IM_END, THINK_END, chat_prompt


def _datagen() -> list[str]:
    script = Path(sys.executable).with_name("datagen")
    if script.exists():
        return [str(script)]
    found = shutil.which("datagen")
    return [found] if found else [sys.executable, "-m", "datagen_operator.cli"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_done_when(standin_tokenizer: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "sim.log").open("wb")
    process = subprocess.Popen(
        [*_datagen(), "sim-server", "--port", str(port), "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: health_status(url) == 200, timeout=60, describe="/health 200", watched=[process], interval=0.05,
            details=(tmp_path / "sim.log").read_text,
        )  # fmt: skip

        health = get(url, "/health")
        assert (health.status, health.body) == (200, b"")

        info = get(url, "/server_info").json()
        assert info["reasoning_parser"] == "kimi_k2"

        bad = post(url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_tokens": 8}})
        assert bad.status == 400

        reply = post(url, "/generate", {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 4096}})
        assert reply.status == 200
        result = reply.json()
        assert THINK_END in result["output_ids"]
        assert result["output_ids"][-1] == IM_END
        assert len(result["output_ids"]) == result["meta_info"]["completion_tokens"]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(10) == 0
        log.close()


@pytest.mark.parametrize("flag", ["--reasoning-parser", "--tool-call-parser"])
def test_unknown_parser_exits_2(flag: str) -> None:
    result = subprocess.run(
        [*_datagen(), "sim-server", flag, "bogus"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "invalid choice: 'bogus'" in result.stderr
