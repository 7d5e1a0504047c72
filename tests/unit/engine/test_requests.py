"""One builder of the `/generate` body (engine/requests.py): the worker and the canary send what it builds, byte for
byte, and no other module of the package writes a body of its own."""

from __future__ import annotations

import ast

import orjson
import pytest

from datagen_operator.engine.requests import generate_body, sampling_for_sample
from tests.unit.test_layers import PACKAGE

SAMPLING = {"max_new_tokens": 64, "temperature": 0.6, "sampling_seed": 10, "stop_token_ids": [2, 7]}


@pytest.mark.parametrize(
    ("sample", "stream", "expected"),
    [
        (0, False, b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":64,"temperature":0.6,'
                   b'"sampling_seed":10,"stop_token_ids":[2,7]}}'),
        (2, False, b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":64,"temperature":0.6,'
                   b'"sampling_seed":12,"stop_token_ids":[2,7]}}'),
        (2, True, b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":64,"temperature":0.6,'
                  b'"sampling_seed":12,"stop_token_ids":[2,7]},"stream":true}'),
    ],
)  # fmt: skip
def test_the_body_is_the_bytes_sglang_has_always_been_sent(sample: int, stream: bool, expected: bytes) -> None:
    """Key order and spelling as they were (SGLang 0.5.23 refuses unknown keys): `stream` only when streamed."""
    assert generate_body([1, 2, 3], SAMPLING, sample=sample, stream=stream) == expected


def test_a_fixed_seed_is_offset_by_the_sample_and_nothing_else_changes() -> None:
    assert sampling_for_sample(SAMPLING, 0) is SAMPLING
    assert sampling_for_sample(SAMPLING, 3) == {**SAMPLING, "sampling_seed": 13}
    assert sampling_for_sample({"max_new_tokens": 1}, 3) == {"max_new_tokens": 1}
    body = orjson.loads(generate_body([5], {"max_new_tokens": 1}, sample=4))
    assert body == {"input_ids": [5], "sampling_params": {"max_new_tokens": 1}}


def _sources() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text(encoding="utf-8"))
        for path in PACKAGE.rglob("*.py")
        if "sim" not in path.relative_to(PACKAGE).parts  # the simulator reads bodies as SGLang does
    }


def test_only_engine_requests_writes_a_generate_body() -> None:
    writers = sorted(
        name
        for name, tree in _sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        and any(isinstance(key, ast.Constant) and key.value == "sampling_params" for key in node.keys)
    )
    assert writers == ["engine/requests.py"]


def test_the_worker_and_the_canary_send_the_one_builders_body() -> None:
    sources = _sources()
    for module in ("worker/lanes.py", "steps/canary.py"):
        calls = [
            node
            for node in ast.walk(sources[module])
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "generate_body"
        ]
        assert calls, f"{module} sends a /generate body that engine.requests.generate_body did not build"
