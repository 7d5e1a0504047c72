"""`sampling_params` of /generate, validated as SGLang 0.5.23 does, in its two stages.

1. The HTTP contract gate (sglang/srt/entrypoints/api_contract.py, the schema of sglang/api/v1/api_types.py):
   an unknown key (e.g. OpenAI's `max_tokens`) or a value of the wrong JSON type (a float `max_new_tokens`, a
   string `top_k`) is a 400 with a flat body `{"error": "<text>"}`, texts worded as SGLang's (serde's) are.
   `null` means "the default".
2. `SamplingParams.verify` (sglang/srt/sampling/sampling_params.py) in the tokenizer manager: values out of range
   (`top_k: 0`, `repetition_penalty` above 2, a negative temperature, ...) are a 400 with
   `{"error": {"message": ...}}`.
tests/contract/test_generate_requests.py runs SGLang's own code on a corpus and holds this module to it.
Keys SGLang accepts but the simulator does not model (grammars, penalties, logit_bias, beam_width,
watermark, choice) are validated and otherwise ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

DEFAULT_MAX_NEW_TOKENS = 128
MAX_STOP_STRINGS = 32
MAX_STOP_REGEX_BYTES = 256
_SAMPLING_EPS = 1e-6

# The schema's JSON kind of each key, in the schema's order (the order its unknown-key message lists them).
KEY_KINDS: dict[str, str] = {
    "max_new_tokens": "int", "stop": "str_or_list", "stop_token_ids": "int_list", "stop_regex": "str_or_list",
    "temperature": "float", "top_p": "float", "top_k": "int", "min_p": "float", "frequency_penalty": "float",
    "presence_penalty": "float", "repetition_penalty": "float", "min_new_tokens": "int", "n": "int",
    "json_schema": "str", "regex": "str", "ebnf": "str", "structural_tag": "str", "ignore_eos": "bool",
    "skip_special_tokens": "bool", "spaces_between_special_tokens": "bool", "no_stop_trim": "bool",
    "stream_interval": "int", "logit_bias": "float_map", "sampling_seed": "int", "custom_params": "any",
    "beam_width": "int", "watermark": "map", "choice": "str_list",
}  # fmt: skip
KNOWN_KEYS: frozenset[str] = frozenset(KEY_KINDS)
GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


class SamplingParamsError(ValueError):
    """A 400. `flat` selects the body shape: {"error": text} (contract gate) vs {"error": {"message": text}}."""

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
    greedy: bool = False
    """Temperature below SGLang's epsilon, or top_k 1: SGLang takes the argmax (`is_all_greedy`)."""
    stream_interval: int | None = None
    """None: the server's default interval."""


# --- stage 1: the contract gate --------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def shown(value: object) -> str:
    """How the contract's (serde's) messages name an unexpected JSON value."""
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    names: dict[type, str] = {list: "sequence", dict: "map"}
    return names.get(type(value), type(value).__name__)


def _invalid_type(value: object, expected: str) -> SamplingParamsError:
    return SamplingParamsError(f"invalid type: {shown(value)}, expected {expected}", flat=True)


def check_kind(value: object, kind: str) -> None:
    """A flat 400 unless `value` has the schema's JSON `kind` (see KEY_KINDS; also "bool_or_list")."""
    if kind == "bool_or_list" and isinstance(value, list):
        kind = "bool_list"
    elif kind == "bool_or_list":
        kind = "bool"
    _check_kind(value, kind)


def _check_kind(value: object, kind: str) -> None:
    if kind == "int" and not _is_int(value):
        raise _invalid_type(value, "i64")
    if kind == "float" and not _is_number(value):
        raise _invalid_type(value, "f64")
    if kind == "bool" and not isinstance(value, bool):
        raise _invalid_type(value, "a boolean")
    if kind == "str" and not isinstance(value, str):
        raise _invalid_type(value, "a string")
    if kind in ("map", "float_map") and not isinstance(value, dict):
        raise _invalid_type(value, "a map")
    if kind == "float_map":
        for item in cast("dict[str, object]", value).values():
            _check_kind(item, "float")
    if kind in ("int_list", "str_list", "bool_list"):
        if not isinstance(value, list):
            raise _invalid_type(value, "a sequence")
        for item in value:
            _check_kind(item, kind.removesuffix("_list"))
    if kind == "str_or_list":
        if isinstance(value, list):
            _check_kind(value, "str_list")
        elif not isinstance(value, str):
            raise _invalid_type(value, "a value or an array of values for StringOrList")


def check_contract(raw: object) -> None:
    """Stage 1 alone: the JSON types of one sampling_params object (a flat 400 when wrong)."""
    if not isinstance(raw, Mapping):
        raise _invalid_type(raw, "struct SamplingParams")
    for key, value in raw.items():
        if key not in KEY_KINDS:
            listed = ", ".join(f"`{name}`" for name in KEY_KINDS)
            raise SamplingParamsError(f"unknown field `{key}`, expected one of {listed}", flat=True)
        if value is not None:
            _check_kind(value, KEY_KINDS[key])


# --- stage 2: SamplingParams construction, normalize() and verify() ---------------------------------------


def _value(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key)
    return default if value is None else value


def _in_range(key: str, value: float, low: float, high: float, *, open_low: bool = False) -> None:
    if not (low < value <= high if open_low else low <= value <= high):
        interval = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise SamplingParamsError(f"{key} must be in {interval}, got {value}.")


def _verify(raw: Mapping[str, Any], max_new_tokens: int | None, min_new_tokens: int) -> None:
    beam_width = raw.get("beam_width")
    if beam_width is not None and beam_width < 1:
        raise SamplingParamsError(f"beam_width must be at least 1, got {beam_width}.")
    temperature = float(_value(raw, "temperature", 1.0))
    if not math.isfinite(temperature) or temperature < 0:
        raise SamplingParamsError(f"temperature must be a non-negative finite number, got {temperature}.")
    greedy = temperature < _SAMPLING_EPS  # SGLang turns a zero temperature into top_k 1
    _in_range("top_p", _value(raw, "top_p", 1.0), 0.0, 1.0, open_low=True)
    _in_range("min_p", _value(raw, "min_p", 0.0), 0.0, 1.0)
    top_k = 1 if greedy else _value(raw, "top_k", -1)
    if top_k < 1 and top_k != -1:  # -1 means the whole vocabulary
        raise SamplingParamsError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    _in_range("frequency_penalty", _value(raw, "frequency_penalty", 0.0), -2.0, 2.0)
    _in_range("presence_penalty", _value(raw, "presence_penalty", 0.0), -2.0, 2.0)
    repetition_penalty = _value(raw, "repetition_penalty", 1.0)
    if not 0.0 < repetition_penalty <= 2.0:
        raise SamplingParamsError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition_penalty}.")
    if min_new_tokens < 0:
        raise SamplingParamsError(f"min_new_tokens must be in [0, max_new_tokens], got {min_new_tokens}.")
    if max_new_tokens is not None:
        if max_new_tokens < 0:
            raise SamplingParamsError(f"max_new_tokens must be at least 0, got {max_new_tokens}.")
        if min_new_tokens > max_new_tokens:
            raise SamplingParamsError(
                f"min_new_tokens must be in [0, max_new_tokens({max_new_tokens})], got {min_new_tokens}."
            )
    seed = raw.get("sampling_seed")
    if seed is not None and not -(2**63) <= seed <= 2**63 - 1:
        raise SamplingParamsError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.")
    if sum(raw.get(key) not in (None, "") for key in GRAMMAR_KEYS) > 1:
        raise SamplingParamsError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")


def _strings(value: str | list[str] | None) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _normalize_stops(raw: Mapping[str, Any]) -> tuple[str, ...]:
    stop = _strings(raw.get("stop"))
    if len(stop) > MAX_STOP_STRINGS:
        raise SamplingParamsError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}")
    regexes = _strings(raw.get("stop_regex"))
    if len(regexes) > MAX_STOP_STRINGS:
        raise SamplingParamsError(f"at most {MAX_STOP_STRINGS} stop_regex patterns are allowed, got {len(regexes)}")
    for regex in regexes:
        size = len(regex.encode())
        if size > MAX_STOP_REGEX_BYTES:
            raise SamplingParamsError(f"stop_regex is {size} bytes, over the {MAX_STOP_REGEX_BYTES}-byte limit")
    return tuple(item for item in stop if item)


def parse_sampling_params(raw: object) -> SamplingParams:
    """The validated parameters, or SamplingParamsError (a 400)."""
    if raw is None:
        return SamplingParams()
    check_contract(raw)
    assert isinstance(raw, Mapping)
    max_new_tokens = raw.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    min_new_tokens = _value(raw, "min_new_tokens", 0)
    _verify(raw, max_new_tokens, min_new_tokens)
    stop = _normalize_stops(raw)
    # SGLang admits any integer and streams with `stream_interval or` its server default; below 1 the
    # simulator takes its default too.
    stream_interval = raw.get("stream_interval")
    if stream_interval is not None and stream_interval < 1:
        stream_interval = None
    temperature = float(_value(raw, "temperature", 1.0))
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        stop=stop,
        stop_token_ids=frozenset(raw.get("stop_token_ids") or ()),
        ignore_eos=_value(raw, "ignore_eos", False),
        skip_special_tokens=_value(raw, "skip_special_tokens", True),
        no_stop_trim=_value(raw, "no_stop_trim", False),
        n=_value(raw, "n", 1),
        sampling_seed=raw.get("sampling_seed"),
        temperature=temperature,
        greedy=temperature < _SAMPLING_EPS or _value(raw, "top_k", -1) == 1,
        stream_interval=stream_interval,
    )
