"""SGLang's own request validation on the requests we send, and on a corpus the simulator must judge alike.

The bodies are built by the functions the worker and the canary (`engine.requests.generate_body` over
`engine.requests.run_sampling`) and the
parser probe (`engine.client.reads.chat_probe_body`) use. SGLang's side runs its HTTP contract gate, its batch
normalisation, the tokenizer manager's length validation and `SamplingParams` construction, `normalize()` and
`verify()` (tests/contract/sglang_side.py).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from datagen_operator.api.generation_spec import SamplingParams as SpecSampling
from datagen_operator.engine.client.reads import chat_probe_body
from datagen_operator.engine.requests import generate_body, run_sampling
from datagen_operator.engine.sim.protocol import RequestError, parse_generate_request
from datagen_operator.engine.sim.sampling import SamplingParamsError, parse_sampling_params
from datagen_operator.presets import get_preset, preset_names
from tests.contract import sglang_side
from tests.contract.conftest import SGLang
from tests.contract.sglang_side import CONTEXT_LENGTH, VOCAB_SIZE

PROMPT = [163584, 1008, 2009, 163601]

# The spec's sampling as users write it: only the required key, the example's, and every key the spec allows.
SPEC_SAMPLINGS: dict[str, dict[str, Any]] = {
    "minimal": {"max_new_tokens": 4096},
    "example": {"max_new_tokens": 16384, "temperature": 0.6, "top_p": 0.95},
    "every-key": {
        "max_new_tokens": 8192, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.05, "min_new_tokens": 1,
        "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1, "stop_token_ids": [7],
        "sampling_seed": 1234,
    },
}  # fmt: skip


def _stop_ids(preset: str) -> list[int]:
    ids = [token.id for token in get_preset(preset).stop_tokens if token.id is not None]
    return ids or [2]  # a preset that resolves its stop id from the tokenizer: any id stands for it


def _bodies(preset: str, spec_sampling: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = SpecSampling.model_validate(spec_sampling)
    stops = _stop_ids(preset)
    run = run_sampling(spec, stops)
    bodies = {
        f"worker-sample{sample}-{'stream' if stream else 'whole'}": generate_body(
            PROMPT, run, sample=sample, stream=stream
        )
        for sample in (0, 1)
        for stream in (False, True)
    }
    bodies["canary-capped"] = generate_body(PROMPT, {**run, "max_new_tokens": 512})
    bodies["canary-full"] = generate_body(PROMPT, run)
    return {name: orjson.loads(body) for name, body in bodies.items()}


@pytest.mark.parametrize("spec_sampling", list(SPEC_SAMPLINGS))
@pytest.mark.parametrize("preset", preset_names())
def test_sglang_admits_every_generate_request_we_send(sglang: SGLang, preset: str, spec_sampling: str) -> None:
    for name, body in _bodies(preset, SPEC_SAMPLINGS[spec_sampling]).items():
        verdict = sglang.call(sglang_side.generate_verdict, body, CONTEXT_LENGTH, VOCAB_SIZE)
        assert verdict is None, f"{name}: {body} -> {verdict}"
        parse_sampling_params(body["sampling_params"])  # and the simulator admits it too


@pytest.mark.parametrize("preset", preset_names())
def test_sglang_admits_the_parser_probe(sglang: SGLang, preset: str) -> None:
    switch = get_preset(preset).thinking.switch
    body = chat_probe_body("served-model", {switch: True} if switch else {}, max_tokens=4096)
    assert sglang.call(sglang_side.chat_request_verdict, body) is None


def test_sglang_refuses_an_over_long_request(sglang: SGLang) -> None:
    # The admission checks above can fail: the same path refuses what the context cannot hold.
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": CONTEXT_LENGTH}}
    verdict = sglang.call(sglang_side.generate_verdict, body, CONTEXT_LENGTH, VOCAB_SIZE)
    assert verdict is not None and verdict["status"] == 400


# sampling_params SGLang admits or refuses; each is judged by SGLang and by the simulator.
CORPUS: dict[str, dict[str, Any]] = {
    "empty": {},
    "max-new-tokens": {"max_new_tokens": 16},
    "max-new-tokens-null": {"max_new_tokens": None},
    "max-new-tokens-zero": {"max_new_tokens": 0},
    "max-new-tokens-negative": {"max_new_tokens": -1},
    "max-new-tokens-float": {"max_new_tokens": 16.0},
    "max-new-tokens-string": {"max_new_tokens": "16"},
    "max-new-tokens-bool": {"max_new_tokens": True},
    "openai-max-tokens": {"max_tokens": 16},
    "openai-max-completion-tokens": {"max_completion_tokens": 16},
    "unknown-key": {"max_new_tokens": 16, "seed": 1},
    "temperature-zero": {"temperature": 0},
    "temperature-negative": {"temperature": -0.5},
    "temperature-large": {"temperature": 100.0},
    "temperature-string": {"temperature": "0.7"},
    "top-p-zero": {"top_p": 0.0},
    "top-p-one": {"top_p": 1},
    "top-p-above-one": {"top_p": 1.5},
    "top-k-zero": {"top_k": 0},
    "top-k-minus-one": {"top_k": -1},
    "top-k-minus-two": {"top_k": -2},
    "top-k-zero-greedy": {"top_k": 0, "temperature": 0.0},
    "top-k-float": {"top_k": 20.0},
    "min-p-one": {"min_p": 1.0},
    "min-p-above-one": {"min_p": 1.5},
    "min-p-negative": {"min_p": -0.1},
    "frequency-penalty-edge": {"frequency_penalty": -2},
    "frequency-penalty-above": {"frequency_penalty": 2.5},
    "presence-penalty-below": {"presence_penalty": -2.1},
    "repetition-penalty-two": {"repetition_penalty": 2.0},
    "repetition-penalty-above-two": {"repetition_penalty": 2.5},
    "repetition-penalty-zero": {"repetition_penalty": 0.0},
    "min-new-tokens-above-max": {"max_new_tokens": 4, "min_new_tokens": 5},
    "min-new-tokens-negative": {"min_new_tokens": -1},
    "stop-string": {"stop": "</answer>"},
    "stop-list": {"stop": ["a", "b"]},
    "stop-number": {"stop": 3},
    "stop-too-many": {"stop": [f"s{index}" for index in range(33)]},
    "stop-token-ids": {"stop_token_ids": [1, 2]},
    "stop-token-ids-float": {"stop_token_ids": [1.0]},
    "stop-regex-too-long": {"stop_regex": "a" * 257},
    "n-two": {"n": 2},
    "n-zero": {"n": 0},
    "stream-interval-zero": {"stream_interval": 0},
    "stop-list-of-numbers": {"stop": [1]},
    "ignore-eos-string": {"ignore_eos": "yes"},
    "skip-special-tokens-false": {"skip_special_tokens": False},
    "sampling-seed": {"sampling_seed": 7},
    "sampling-seed-float": {"sampling_seed": 7.5},
    "two-grammars": {"regex": "a+", "ebnf": "root ::= 'a'"},
    "beam-width-zero": {"beam_width": 0},
    "logit-bias": {"logit_bias": {"5": 1.0}},
    "spaces-between-special-tokens": {"spaces_between_special_tokens": False},
}


def _simulator_verdict(params: dict[str, Any]) -> dict[str, Any] | None:
    try:
        parse_sampling_params(params)
    except SamplingParamsError as error:
        return {"status": 400, "body": error.body()}
    return None


@pytest.mark.parametrize("label", list(CORPUS))
def test_simulator_judges_sampling_params_as_sglang_does(sglang: SGLang, label: str) -> None:
    body = {"input_ids": PROMPT, "sampling_params": CORPUS[label]}
    expected = sglang.call(sglang_side.generate_verdict, body, CONTEXT_LENGTH, VOCAB_SIZE)
    assert _simulator_verdict(CORPUS[label]) == expected


class _CharVocab:
    """What the simulator's request parsing reads of its vocabulary: the size, and `encode` for `text`."""

    size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return [ord(char) for char in text]


SHORT_CONTEXT = 64

# Whole /generate bodies, judged against a short context so the length checks are exercised.
BODY_CORPUS: dict[str, dict[str, Any]] = {
    "fits": {"input_ids": [1] * 32, "sampling_params": {"max_new_tokens": 32}},
    "prompt-plus-budget-over": {"input_ids": [1] * 32, "sampling_params": {"max_new_tokens": 33}},
    "prompt-at-context": {"input_ids": [1] * SHORT_CONTEXT, "sampling_params": {"max_new_tokens": 1}},
    "prompt-over-context": {"input_ids": [1] * (SHORT_CONTEXT + 1), "sampling_params": {"max_new_tokens": 1}},
    "default-budget-over": {"input_ids": [1] * 32},
    "unbounded-budget": {"input_ids": [1] * 32, "sampling_params": {"max_new_tokens": None}},
    "batch-one-over": {"input_ids": [[1] * 8, [1] * 40], "sampling_params": {"max_new_tokens": 30}},
    "batch-params-list": {"input_ids": [[1], [2]], "sampling_params": [{"max_new_tokens": 4}, {"top_k": 0}]},
    "text": {"text": "hello", "sampling_params": {"max_new_tokens": 4}},
    "float-id": {"input_ids": [1.5], "sampling_params": {"max_new_tokens": 4}},
    "string-ids": {"input_ids": "1 2", "sampling_params": {"max_new_tokens": 4}},
    "neither-text-nor-ids": {"sampling_params": {"max_new_tokens": 4}},
    "text-and-ids": {"text": "a", "input_ids": [1], "sampling_params": {"max_new_tokens": 4}},
    "stream-not-bool": {"input_ids": [1], "stream": "yes", "sampling_params": {"max_new_tokens": 4}},
    "sampling-params-not-object": {"input_ids": [1], "sampling_params": 5},
    "empty-input-ids": {"input_ids": [], "sampling_params": {"max_new_tokens": 4}},
}


def _simulator_body_verdict(body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        parse_generate_request(body, _CharVocab(), SHORT_CONTEXT)  # type: ignore[arg-type]
    except RequestError as error:
        return {"status": error.status, "body": error.body()}
    return None


@pytest.mark.parametrize("label", list(BODY_CORPUS))
def test_simulator_judges_generate_bodies_as_sglang_does(sglang: SGLang, label: str) -> None:
    body = BODY_CORPUS[label]
    expected = sglang.call(sglang_side.generate_verdict, body, SHORT_CONTEXT, VOCAB_SIZE)
    assert _simulator_body_verdict(body) == expected
