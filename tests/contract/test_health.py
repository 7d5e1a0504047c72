"""SGLang's health semantics (engine/health.py) against the pinned wheel's own source and parser: the timeout
its health call waits for scheduler output (and the environment variable that sets it), the one-second look,
that `/health` generates too by default, and the watchdog's default; the probes built from them."""

from __future__ import annotations

import ast

from datagen_operator.api import parse_spec
from datagen_operator.engine import health
from datagen_operator.k8s import object_meta, server_manifests
from tests.contract import sglang_side
from tests.contract.conftest import SGLang
from tests.contract.wheel import unpacked_sglang
from tests.manifests import bare_spec


def _source(relative_path: str) -> str:
    return (unpacked_sglang() / "sglang" / relative_path).read_text()


def _function(text: str, name: str) -> str:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise LookupError(name)


def test_the_health_timeout_and_its_environment_variable_are_sglangs() -> None:
    text = _source("srt/entrypoints/http_server.py")
    assigned = {
        node.targets[0].id: node.value
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    # HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
    getenv = assigned["HEALTH_CHECK_TIMEOUT"].args[0]  # type: ignore[attr-defined]
    assert [ast.literal_eval(arg) for arg in getenv.args] == [
        health.HEALTH_CHECK_TIMEOUT_ENV,
        health.HEALTH_CHECK_TIMEOUT_S,
    ]


def test_a_health_call_generates_and_looks_once_a_second() -> None:
    source = _function(_source("srt/entrypoints/http_server.py"), "health_generate")
    assert '@app.get("/health")' in _source("srt/entrypoints/http_server.py")
    assert f"await asyncio.sleep({int(health.HEALTH_POLL_S)})" in source
    assert "while time.time() < tic + HEALTH_CHECK_TIMEOUT:" in source
    assert '"max_new_tokens": 1' in source  # a one-token generation
    # /health is answered without generating only when this switch is off; it is on by default.
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in source
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True)" in _source("srt/environ.py")


def test_the_watchdog_default_is_sglangs(sglang: SGLang) -> None:
    argv = ["--model-path", str(sglang.model_dir)]
    parsed = sglang.call(sglang_side.parsed_fields, argv, ["watchdog_timeout"])
    assert parsed["watchdog_timeout"] == health.WATCHDOG_TIMEOUT_S
    raised = sglang.call(sglang_side.parsed_fields, [*argv, "--watchdog-t", "900"], ["watchdog_timeout"])
    # server.extraArgs read as SGLang's parser reads them (abbreviation included) sets the liveness budget.
    spec = parse_spec(bare_spec(**{"model.preset": "kimi-k2.5", "server.extraArgs": ["--watchdog-t", "900"]}))
    template = server_manifests.server_statefulset(object_meta.RunRef("r", "ns", "uid"), spec, 1)["spec"]["template"]
    probe = template["spec"]["containers"][0]["livenessProbe"]
    assert (
        probe["periodSeconds"] * probe["failureThreshold"] > raised["watchdog_timeout"] + health.HEALTH_CHECK_TIMEOUT_S
    )
