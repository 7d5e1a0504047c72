"""Pure decisions: retry classification, backoff, error text, stream joining, request and fingerprint building."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
import pytest

from datagen_operator.api import parse_spec
from datagen_operator.api.resolve import resolve_model
from datagen_operator.engine.client.generate import parse_generate_body
from datagen_operator.engine.client.policy import (
    RequestFailed,
    RetryPolicy,
    Verdict,
    abort_verdict,
    backoff_delay,
    classify_answer,
    classify_status,
    error_reason,
    stream_error_verdict,
)
from datagen_operator.engine.requests import generate_body, sampling_for_sample
from datagen_operator.output.fingerprint import (
    diff_fingerprints,
    server_fingerprint,
    tokenizer_files,
    tokenizer_fingerprint,
)
from datagen_operator.prompts.job import Job
from datagen_operator.prompts.render import template_variables
from tests.manifests import bare_spec
from tests.streams import read_chunks


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(200, Verdict.OK), (503, Verdict.DOWN), (500, Verdict.RETRY), (502, Verdict.RETRY), (429, Verdict.RETRY),
     (408, Verdict.RETRY), (400, Verdict.REJECT), (404, Verdict.REJECT), (422, Verdict.REJECT)],
)  # fmt: skip
def test_status_classification(status: int, verdict: Verdict) -> None:
    assert classify_status(status) is verdict


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(max_attempts=10, base_s=0.5, cap_s=4.0)
    assert [backoff_delay(n, policy, 0.999999) for n in (1, 2, 3, 4, 5, 9)] == pytest.approx([0.5, 1, 2, 4, 4, 4], 1e-4)
    assert backoff_delay(3, policy, 0.0) == 0.0
    assert backoff_delay(5000, policy, 0.5) == 2.0  # an overloaded server refuses without limit: no overflow
    rng = random.Random(7)
    delays = [backoff_delay(6, policy, rng.random()) for _ in range(200)]
    assert max(delays) <= 4.0 and min(delays) < 1.0 and len({round(d, 3) for d in delays}) > 150


def test_error_reason_reads_both_sglang_error_shapes() -> None:
    assert error_reason(b'{"error": "unknown sampling param max_tokens"}') == "unknown sampling param max_tokens"
    assert error_reason(b'{"error": {"message": "prompt too long", "code": 400}}') == "prompt too long"
    assert error_reason(b"") == "(empty body)"
    assert error_reason(b"<html>bad gateway</html>") == "<html>bad gateway</html>"


def test_aborted_answers_are_classified_by_their_status_code() -> None:
    assert abort_verdict({"type": "stop", "matched": 1}) is None
    assert abort_verdict({"type": "abort", "message": "too long", "status_code": 400})[0] is Verdict.REJECT
    # SGLang's scheduler aborts with 503 only to shed load (a full queue, a waiting or running timeout): alive.
    assert abort_verdict({"type": "abort", "message": "The request queue is full.", "status_code": 503})[0] is (
        Verdict.BUSY
    )
    assert abort_verdict({"type": "abort", "message": "retracted"})[0] is Verdict.RETRY


def test_a_503_from_sglang_itself_is_overload_and_a_bare_503_is_an_outage() -> None:
    # SGLang's HTTPException handler answers an aborted non-streaming request with an ErrorResponse.
    shed = b'{"object": "error", "message": "The request queue is full.", "type": "503", "param": null, "code": 503}'
    assert classify_answer(503, shed) is Verdict.BUSY
    assert classify_answer(503, b'{"error": {"message": "Request waiting timeout reached."}}') is Verdict.BUSY
    assert classify_answer(503, b"") is Verdict.DOWN  # warming up, shutting down: SGLang's empty body
    assert classify_answer(503, b"no healthy upstream") is Verdict.DOWN  # a proxy with no server behind it
    assert classify_answer(500, shed) is Verdict.RETRY and classify_answer(400, shed) is Verdict.REJECT


def test_stream_error_events_carry_their_status() -> None:
    # `http_server.serve_generate_request` streams a ValueError as code 400, never retryable.
    refused = {"message": "bad input", "type": "invalid_request_error", "code": 400, "retryable": False}
    assert stream_error_verdict(refused) == (Verdict.REJECT, "stream error: bad input", 400)
    assert stream_error_verdict({"message": "oom", "retryable": True})[::2] == (Verdict.RETRY, None)
    assert stream_error_verdict({"message": "full", "code": 503, "retryable": True})[0] is Verdict.BUSY
    assert stream_error_verdict({"message": "boom", "code": 500, "retryable": False})[0] is Verdict.RETRY
    assert stream_error_verdict("text")[0] is Verdict.RETRY


def test_generate_body_parsing() -> None:
    ids, meta, raw = parse_generate_body(b'{"text": "x", "output_ids": [5, 6], "meta_info": {"completion_tokens": 2}}')
    assert ids == [5, 6] and meta == {"completion_tokens": 2} and raw == b"[5, 6]"
    with pytest.raises(RequestFailed, match="no output_ids"):
        parse_generate_body(b'{"text": "only text"}')


def _sse(*events: dict | str) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n" for e in events)


def test_incremental_stream_is_joined_across_arbitrary_chunk_boundaries() -> None:
    body = _sse(
        {"output_ids": [1, 2], "meta_info": {"finish_reason": None, "completion_tokens": 2}},
        {"output_ids": [3], "meta_info": {"finish_reason": None, "completion_tokens": 3}},
        {"output_ids": [4], "meta_info": {"finish_reason": {"type": "stop", "matched": 4}, "completion_tokens": 4}},
        "[DONE]",
    )
    for size in (1, 7, 64, len(body)):
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        ids, meta = read_chunks(chunks)
        assert ids == [1, 2, 3, 4] and meta["completion_tokens"] == 4


def test_stream_errors_and_early_ends_are_retryable_or_permanent_as_the_server_says() -> None:
    retryable = _sse({"output_ids": [1], "meta_info": {}}, {"error": {"message": "oom", "retryable": True}})
    with pytest.raises(RequestFailed) as caught:
        read_chunks([retryable])
    assert caught.value.verdict is Verdict.RETRY
    permanent = _sse({"error": {"message": "bad input", "retryable": False}}, "[DONE]")
    with pytest.raises(RequestFailed) as caught:
        read_chunks([permanent])
    assert caught.value.verdict is Verdict.REJECT and caught.value.status is None
    refused = _sse({"error": {"message": "bad", "type": "invalid_request_error", "code": 400, "retryable": False}})
    with pytest.raises(RequestFailed) as caught:
        read_chunks([refused])
    assert caught.value.verdict is Verdict.REJECT and caught.value.status == 400
    cut = _sse({"output_ids": [1], "meta_info": {"finish_reason": None}})
    with pytest.raises(RequestFailed, match="ended before"):
        read_chunks([cut])


def test_payload_always_has_max_new_tokens_and_per_sample_seeds() -> None:
    sampling = {"max_new_tokens": 64, "temperature": 0.6, "sampling_seed": 10}
    job = Job(0, "p", 2, [1, 2, 3], False, 0)
    body = orjson.loads(generate_body(job.input_ids, sampling, sample=job.sample))
    assert body == {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 64, "temperature": 0.6,
                                                                  "sampling_seed": 12}}  # fmt: skip
    assert sampling_for_sample({"max_new_tokens": 1}, 3) == {"max_new_tokens": 1}
    assert orjson.loads(generate_body(job.input_ids, {"max_new_tokens": 1}, stream=True))["stream"] is True


def _resolved(preset: str | None, thinking: bool | None, **server: str):
    changes: dict[str, object] = {"server": server}
    if preset:
        changes["model.preset"] = preset
    if thinking is not None:
        changes["generation.thinking"] = thinking
    spec = bare_spec(**changes)
    return resolve_model(parse_spec(spec))


def test_thinking_switch_follows_the_preset() -> None:
    assert template_variables(_resolved("kimi-k2.5", None)) == {"thinking": True}
    assert template_variables(_resolved("kimi-k2.5", False)) == {"thinking": False}
    assert template_variables(_resolved("qwen3", False)) == {"enable_thinking": False}
    assert template_variables(_resolved("kimi-k2-thinking", None)) == {}
    generic = _resolved(None, False, reasoningParser="none", toolCallParser="none")
    assert template_variables(generic) == {"thinking": False, "enable_thinking": False}


def test_fingerprint_ignores_addresses_and_names_what_changed(tmp_path: Path) -> None:
    info = {"version": "0.5.23", "model_path": "/m", "tp_size": 8, "port": 30000, "host": "10.0.0.1",
            "startup_time": 1.0, "sim_speed": "wire", "reasoning_parser": "kimi_k2", "quantization": None,
            "max_total_num_tokens": 812_000}  # fmt: skip
    moved = {**info, "port": 30001, "host": "10.0.0.2", "startup_time": 2.0, "sim_speed": "gpu", "tp_size": 4,
             "max_total_num_tokens": 790_112, "some_new_flag": True}  # fmt: skip
    assert server_fingerprint(info) == server_fingerprint(moved), "replicas and restarts of the same data"
    changed = server_fingerprint({**info, "quantization": "fp8", "version": "0.5.22"})
    lines = diff_fingerprints({"server": server_fingerprint(info)}, {"server": changed})
    assert lines == ['server.args.quantization: null -> "fp8"', 'server.version: "0.5.23" -> "0.5.22"']

    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("a")
    (tmp_path / "model-00001-of-00064.safetensors").write_bytes(b"\0" * 10)
    (tmp_path / "config.json").write_text("{}")
    assert [p.name for p in tokenizer_files(tmp_path)] == ["chat_template.jinja", "tokenizer.json"]
    before = tokenizer_fingerprint(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("b")
    lines = diff_fingerprints({"tokenizer": before}, {"tokenizer": tokenizer_fingerprint(tmp_path)})
    assert len(lines) == 1 and lines[0].startswith("tokenizer.files.chat_template.jinja: ")


def test_endpoint_choice_is_least_in_flight_with_ties_rotating() -> None:
    from datagen_operator.engine.client.pool import EndpointPool

    async def scenario() -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(["http://a", "http://b/", "http://c"], session, unreachable_after_s=1)
            a, b, c = pool.endpoints
            assert b.url == "http://b"
            picks = [pool.pick() for _ in range(6)]
            assert {p.url for p in picks} == {"http://a", "http://b", "http://c"}  # ties rotate
            a.in_flight, b.in_flight, c.in_flight = 3, 1, 2
            assert pool.pick() is b
            b.up = False
            assert pool.pick() is c
            c.disabled = "server changed"
            assert pool.pick() is a
            a.up = False
            assert pool.pick() is None and not pool.any_up

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "body",
    [
        b'{"text":"a \\"output_ids\\": [9]","output_ids":[1,22,333],"meta_info":{}}',
        b'{"output_ids" : [ 1, 22 ,333 ],"meta_info":{"finish_reason":null}}',
        b'{"meta_info":{"x":1},"output_ids":[1,22,333]}',
    ],
)
def test_output_ids_bytes_are_cut_out_exactly(body: bytes) -> None:
    ids, _, raw = parse_generate_body(body)
    assert ids == [1, 22, 333] and raw is not None and orjson.loads(raw) == ids


def test_output_ids_bytes_that_do_not_match_are_not_used() -> None:
    from datagen_operator.engine.client.generate import int_array_text

    assert int_array_text(b'{"output_ids":[1,2,3]}', [1, 2, 4]) is None
    assert int_array_text(b'{"output_ids":[1,2,3]}', [1, 2]) is None
    assert int_array_text(b'{"output_ids":[]}', []) == b"[]"
    assert int_array_text(b'{"output_ids":[7]}', [7]) == b"[7]"
    assert int_array_text(b'{"ids":[7]}', [7]) is None


def test_encoded_record_line_is_the_same_json_either_way() -> None:
    from datagen_operator.output.records import encode_record

    record = {"id": "x", "sample": 0, "input_ids": [1], "output_ids": [5, 6], "flags": []}
    spliced = encode_record(record, b"[5, 6]")
    assert spliced.endswith(b"}\n") and orjson.loads(spliced) == orjson.loads(encode_record(record)) == record
