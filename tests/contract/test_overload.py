"""Overload as SGLang answers it, against its own code (pinned wheel): the scheduler sheds a request with an
abort finish_reason of status 503 (`Scheduler._abort_on_queued_limit` under --max-queued-requests, the
waiting/running timeouts of `_poll_timeout_aborts`); the tokenizer manager turns it into an HTTP 503 with
SGLang's error envelope, or a chunk of a 200 stream. The simulator answers the same bytes, and the worker's
policy reads both as a live server shedding load (back off, no attempt spent, endpoint kept), not an outage.
"""

from __future__ import annotations

import ast

import orjson
import pytest

from datagen_operator.engine.client.policy import Verdict, abort_verdict, classify_answer, stream_error_verdict
from datagen_operator.engine.sim import protocol
from tests.contract import sglang_sim_side
from tests.contract.conftest import SGLang
from tests.contract.wheel import unpacked_sglang


def _function_source(relative_path: str, name: str) -> str:
    text = (unpacked_sglang() / "sglang" / relative_path).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise LookupError(f"{name} is not in sglang/{relative_path}")


def test_the_simulators_queue_full_abort_is_sglangs() -> None:
    source = _function_source("srt/managers/scheduler.py", "_abort_on_queued_limit")
    assert f'message = "{protocol.QUEUE_FULL_MESSAGE}"' in source
    assert '"status_code": HTTPStatus.SERVICE_UNAVAILABLE' in source and '"type": "abort"' in source
    assert protocol.queue_full_finish_reason()["status_code"] == 503


@pytest.mark.parametrize(
    "finish_reason",
    [
        protocol.queue_full_finish_reason(),
        {"type": "abort", "status_code": 503, "message": "Request waiting timeout reached."},
    ],
)
def test_a_shed_request_is_answered_as_sglang_answers_it_and_read_as_overload(
    sglang: SGLang, finish_reason: dict
) -> None:
    answer = sglang.call(sglang_sim_side.abort_answer, finish_reason, False)
    assert (answer["status"], answer["body"]) == protocol.abort_response(finish_reason)
    assert classify_answer(answer["status"], orjson.dumps(answer["body"])) is Verdict.BUSY
    streamed = sglang.call(sglang_sim_side.abort_answer, finish_reason, True)
    assert streamed["chunk"]["meta_info"]["finish_reason"] == finish_reason  # yielded as a chunk, then [DONE]
    verdict = abort_verdict(streamed["chunk"]["meta_info"]["finish_reason"])
    assert verdict is not None and verdict[0] is Verdict.BUSY


def test_a_400_abort_is_still_a_refusal(sglang: SGLang) -> None:
    finish_reason = {"type": "abort", "status_code": 400, "message": "input too long"}
    answer = sglang.call(sglang_sim_side.abort_answer, finish_reason, False)
    assert (answer["status"], answer["body"]) == protocol.abort_response(finish_reason)
    assert classify_answer(answer["status"], orjson.dumps(answer["body"])) is Verdict.REJECT


def test_the_stream_error_event_is_sglangs_and_is_recorded_with_its_code() -> None:
    # `serve_generate_request` streams a ValueError as {"error": {message, type, code, retryable}} then [DONE].
    source = _function_source("srt/entrypoints/http_server.py", "serve_generate_request")
    assert '"type": "invalid_request_error"' in source and '"retryable": False' in source
    assert '"code": getattr(e, "status_code", 400)' in source
    event = protocol.stream_error_payload("bad input")["error"]
    assert set(event) == {"message", "type", "code", "retryable"} and event["code"] == 400
    assert stream_error_verdict(event) == (Verdict.REJECT, "stream error: bad input", 400)
