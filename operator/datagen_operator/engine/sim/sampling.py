"""`sampling_params` of /generate, validated strictly as SGLang 0.5.23 does (sglang-contract.md).

An unknown key (e.g. OpenAI's `max_tokens`) or a float `max_new_tokens` is a 400 with a flat body
`{"error": "<text>"}`; every other invalid value is a 400 with `{"error": {"message": ...}}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128

KNOWN_KEYS: frozenset[str] = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
        "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
        "no_stop_trim", "custom_params", "stream_interval", "logit_bias", "sampling_seed",
    }
)  # fmt: skip


class SamplingParamsError(ValueError):
    """A 400. `flat` selects the body shape: {"error": text} vs {"error": {"message": text}}."""

    def __init__(self, message: str, *, flat: bool = False) -> None:
        super().__init__(message)
        self.flat = flat

    def body(self) -> dict[str, Any]:
        return {"error": str(self)} if self.flat else {"error": {"message": str(self)}}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
    """None: up to the context length."""
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    temperature: float = 1.0
    stream_interval: int | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_field(raw: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is not None and not _is_int(value):
        raise SamplingParamsError(f"{key} must be an integer, got {value!r}.")
    return value


def _bool_field(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SamplingParamsError(f"{key} must be a boolean, got {value!r}.")
    return value


def _number_field(raw: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise SamplingParamsError(f"{key} must be a number, got {value!r}.")
    if not low <= value <= high:
        raise SamplingParamsError(f"{key} must be in [{low}, {high}], got {value}.")
    return float(value)


def _max_new_tokens(raw: Mapping[str, Any]) -> int | None:
    value = raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(value, float):
        raise SamplingParamsError(f"max_new_tokens must be an integer, got float {value!r}", flat=True)
    if value is not None and not _is_int(value):
        raise SamplingParamsError(f"max_new_tokens must be an integer, got {value!r}.")
    if value is not None and value < 0:
        raise SamplingParamsError(f"max_new_tokens must be at least 0, got {value}.")
    return value


def _check_ranges(raw: Mapping[str, Any], max_new_tokens: int | None, min_new_tokens: int) -> None:
    if min_new_tokens < 0 or (max_new_tokens is not None and min_new_tokens > max_new_tokens):
        raise SamplingParamsError(
            f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}."
        )
    top_p = _number_field(raw, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise SamplingParamsError(f"top_p must be in (0, 1], got {top_p}.")
    _number_field(raw, "min_p", 0.0, 0.0, 1.0)
    top_k = _int_field(raw, "top_k", -1)
    if top_k is not None and top_k != -1 and top_k < 1:
        raise SamplingParamsError(f"top_k must be -1 (disable), or at least 1, got {top_k}.")
    _number_field(raw, "frequency_penalty", 0.0, -2.0, 2.0)
    _number_field(raw, "presence_penalty", 0.0, -2.0, 2.0)
    _number_field(raw, "repetition_penalty", 1.0, 0.0, 2.0)


def _stop_strings(raw: Mapping[str, Any]) -> tuple[str, ...]:
    stop = raw.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
        raise SamplingParamsError(f"stop must be a string or a list of strings, got {stop!r}.")
    return tuple(item for item in stop if item)


def _stop_token_ids(raw: Mapping[str, Any]) -> frozenset[int]:
    ids = raw.get("stop_token_ids")
    if ids is None:
        return frozenset()
    if not isinstance(ids, list) or not all(map(_is_int, ids)):
        raise SamplingParamsError(f"stop_token_ids must be a list of integers, got {ids!r}.")
    return frozenset(ids)


def parse_sampling_params(raw: object) -> SamplingParams:
    """The validated parameters, or SamplingParamsError (a 400)."""
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, Mapping):
        raise SamplingParamsError(f"sampling_params must be an object, got {type(raw).__name__}.")
    if not KNOWN_KEYS.issuperset(raw):
        unknown = sorted(set(raw) - KNOWN_KEYS)
        hint = " (did you mean max_new_tokens?)" if {"max_tokens", "max_completion_tokens"} & set(unknown) else ""
        raise SamplingParamsError(f"Unknown sampling parameter(s): {', '.join(unknown)}{hint}", flat=True)
    max_new_tokens = _max_new_tokens(raw)
    min_new_tokens = _int_field(raw, "min_new_tokens", 0) or 0
    if len(raw) > 1 or "max_new_tokens" not in raw:  # the common {"max_new_tokens": N} needs no more
        _check_ranges(raw, max_new_tokens, min_new_tokens)
    n = _int_field(raw, "n", 1)
    if n is None or n < 1:
        raise SamplingParamsError(f"n must be at least 1, got {n}.")
    stream_interval = _int_field(raw, "stream_interval", None)
    if stream_interval is not None and stream_interval < 1:
        raise SamplingParamsError(f"stream_interval must be at least 1, got {stream_interval}.")
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        stop=_stop_strings(raw),
        stop_token_ids=_stop_token_ids(raw),
        ignore_eos=_bool_field(raw, "ignore_eos", False),
        skip_special_tokens=_bool_field(raw, "skip_special_tokens", True),
        no_stop_trim=_bool_field(raw, "no_stop_trim", False),
        n=n,
        sampling_seed=_int_field(raw, "sampling_seed", None),
        temperature=_number_field(raw, "temperature", 1.0, 0.0, float("inf")),
        stream_interval=stream_interval,
    )
