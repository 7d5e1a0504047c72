"""The bodies of the requests this project sends to SGLang's native `/generate`: built once, here.

`sampling_params` keys are SGLang's own (`max_new_tokens`, never OpenAI's `max_tokens`: 0.5.23 refuses unknown
keys with HTTP 400), and `stop_token_ids` always carries the ids the records are checked against, so the
server stops exactly where the checks expect a stop token whatever its own configs say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from datagen_operator.api.spec import SamplingParams


def run_sampling(spec_sampling: SamplingParams, stop_token_ids: Iterable[int]) -> dict[str, Any]:
    """The run's sampling_params as every request (and the data fingerprint) carries them: the spec's keys
    that are set, and the stop ids the records are checked against."""
    params: dict[str, Any] = spec_sampling.model_dump(exclude_none=True)
    stops = sorted({*params.get("stop_token_ids", ()), *stop_token_ids})
    if stops:
        params["stop_token_ids"] = stops
    return params


def generate_body(input_ids: list[int], params: Mapping[str, Any]) -> bytes:
    """A non-streaming, pre-tokenized `/generate` request."""
    return orjson.dumps({"input_ids": input_ids, "sampling_params": params})
