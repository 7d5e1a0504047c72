"""The `datagen` commands a user runs first: validate, server-args, crd, presets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.manifests import EXAMPLES, example_run


def datagen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datagen_operator.cli", *args], capture_output=True, text=True)


def test_validate_example() -> None:
    result = datagen("validate", str(EXAMPLES / "kimi-k2.5.yaml"))
    assert result.returncode == 0, result.stderr
    assert "valid DataGenRun kimi-k25-b1" in result.stdout
    # What it cannot know without the run's files is said, with the command that judges it.
    assert "Not checked here: the files the run reads" in result.stdout
    assert "datagen preflight --run RUN.yaml" in result.stdout


def test_the_regenerate_example_is_valid_and_asks_for_whole_conversations() -> None:
    result = datagen("validate", str(EXAMPLES / "regenerate.yaml"))
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load((EXAMPLES / "regenerate.yaml").read_text())
    assert document["spec"]["generation"]["turns"] == "all"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.server.gpuCount", 8, "spec.server.gpuCount"),
        ("spec.server.tensorParallel", 3, "tensorParallel"),
        ("spec.server.reasoningParser", "kimi", "spec.server.reasoningParser"),
        ("spec.model.preset", "mystery-model", "spec.model.preset"),
        ("spec.clients.shards", 0, "spec.clients.shards"),
        (
            "spec.export",
            {"formats": ["trl"], "excludeFlags": ["truncted"]},
            "spec.export.excludeFlags[0]: unknown truncted",
        ),
    ],
)
def test_validate_refuses_naming_the_field(tmp_path: Path, path: str, value: object, field: str) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(example_run(**{path: value})))
    result = datagen("validate", str(manifest))
    assert result.returncode != 0
    assert field in result.stderr


def test_validate_reports_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    assert datagen("validate", str(tmp_path / "nope.yaml")).returncode != 0
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    result = datagen("validate", str(broken))
    assert result.returncode != 0 and "not valid YAML" in result.stderr


def test_validate_recommends_attention_dp_for_mla_presets_only(tmp_path: Path) -> None:
    result = datagen("validate", str(EXAMPLES / "kimi-k2.5.yaml"))
    assert "hint: kimi-k2.5 is an MLA model" in result.stdout
    assert "server.attentionDataParallel: 8 (SGLang's --attn-dp-size)" in result.stdout
    quiet = datagen("validate", str(EXAMPLES / "deepseek-r1-two-nodes.yaml"), str(EXAMPLES / "presets" / "qwen3.yaml"))
    assert quiet.returncode == 0 and "hint" not in quiet.stdout  # set already; not an MLA model


def test_server_args() -> None:
    result = datagen("server-args", str(EXAMPLES / "kimi-k2.5.yaml"))
    assert result.returncode == 0, result.stderr
    for expected in ("--reasoning-parser kimi_k2", "--tool-call-parser kimi_k2", "--tp-size 8"):
        assert expected in result.stdout


def test_server_args_of_a_two_node_run_says_which_pod_runs_what(tmp_path: Path) -> None:
    document = example_run(
        **{"spec.server.nodes": 2, "spec.server.tensorParallel": 16, "spec.server.attentionDataParallel": 16}
    )
    manifest = tmp_path / "two-nodes.yaml"
    manifest.write_text(yaml.safe_dump(document))
    result = datagen("server-args", str(manifest))
    assert result.returncode == 0, result.stderr
    comment = [line for line in result.stdout.splitlines() if line.startswith("#")]
    assert comment[0] == "# One LeaderWorkerSet group of 2 pods x 8 GPUs; every pod runs this command, Kubernetes"
    assert any(line.startswith("#   pod 0 (leader): --node-rank 0; serves the HTTP API on :30000") for line in comment)
    assert any(line.startswith("#   pod 1 (worker): --node-rank = its index") for line in comment)
    for expected in (
        "--tp-size 16",
        "--attn-dp-size 16",
        "--nnodes 2",
        "--node-rank '$(LWS_WORKER_INDEX)'",
        "--dist-init-addr '$(LWS_LEADER_ADDRESS):20000'",
    ):
        assert expected in result.stdout
    # The one-line form is the bare command, for a shell or a pod spec.
    one_line = datagen("server-args", "--one-line", str(manifest)).stdout
    assert not one_line.startswith("#") and "--nnodes 2" in one_line


def test_presets_lists_every_family() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "datagen_operator.cli", "presets"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    for name in ("kimi-k2.5", "kimi-k2-thinking", "kimi-k2.6", "kimi-k2-instruct", "qwen3", "deepseek-r1", "gpt-oss"):
        assert name in result.stdout


def test_unknown_command_exits_2() -> None:
    assert datagen("frobnicate").returncode == 2


def test_commands_run_arrow_on_its_jemalloc_pool_unless_the_user_chose_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from datagen_operator import cli

    monkeypatch.delenv(cli.ARROW_POOL_VARIABLE, raising=False)
    assert cli.main(["presets"]) == 0
    assert os.environ[cli.ARROW_POOL_VARIABLE] == "jemalloc"
    monkeypatch.setenv(cli.ARROW_POOL_VARIABLE, "system")
    assert cli.main(["presets"]) == 0
    assert os.environ[cli.ARROW_POOL_VARIABLE] == "system"
    # The installed pyarrow has the pool (a wheel without it would fall back with a warning on every command).
    probe = "import pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    env = {**os.environ, cli.ARROW_POOL_VARIABLE: "jemalloc"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "jemalloc", result.stderr
