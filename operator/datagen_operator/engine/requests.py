"""The bodies of the requests this project sends to SGLang's native `/generate`: built once, here.

`sampling_params` keys are SGLang's own (`max_new_tokens`, never OpenAI's `max_tokens`: 0.5.23 refuses unknown
keys with HTTP 400), and `stop_token_ids` always carries the ids the records are checked against, so the
server stops exactly where the checks expect a stop token whatever its own configs say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from datagen_operator.api.generation_spec import SamplingParams


def run_sampling(spec_sampling: SamplingParams, stop_token_ids: Iterable[int]) -> dict[str, Any]:
    """The run's sampling_params as every request (and the data fingerprint) carries them: the spec's keys
    that are set, and the stop ids the records are checked against."""
    params: dict[str, Any] = spec_sampling.model_dump(exclude_none=True)
    stops = sorted({*params.get("stop_token_ids", ()), *stop_token_ids})
    if stops:
        params["stop_token_ids"] = stops
    return params


def sampling_for_sample(sampling: Mapping[str, Any], sample: int) -> Mapping[str, Any]:
    """Sampling params for one sample. A fixed seed is offset by the sample index: samples of one prompt
    must differ (the same seed would make them identical) yet stay reproducible."""
    seed = sampling.get("sampling_seed")
    if seed is None or sample == 0:
        return sampling
    return {**sampling, "sampling_seed": seed + sample}


def generate_body(input_ids: list[int], params: Mapping[str, Any], *, sample: int = 0, stream: bool = False) -> bytes:
    """The pre-tokenized `/generate` request for one sample of a prompt (the worker's and the canary's), streamed
    when `stream`. `max_new_tokens` is always in `params` (the spec requires it; SGLang's default is 128). No
    `rid`: a retried request must not collide with an abandoned one still running."""
    body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling_for_sample(params, sample)}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)
