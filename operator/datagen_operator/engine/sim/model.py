"""The simulated model: a pure function from (prompt ids, sampling params, seeds) to Kimi-K2 output tokens.

What it writes (kimi-k2-format.md): with the prompt ending in `<think>` (thinking on), reasoning tokens,
`</think>`, an answer, sometimes a tool-call section when the prompt declared tools, then `<|im_end|>`.
With `<think></think>` (thinking off) the answer comes directly. Any other prompt tail: the model opens
`<think>` itself (as Kimi-K2-Thinking does) unless `unprompted_thinking` is off.

Misconfigured models (`--sim-misconfig`): `never-close-think` writes reasoning and answer with no
`</think>`; `kimi-tags` writes the old format's `◁think▷`/`◁/think▷` as text instead of the think tokens;
`ignore-thinking` never reasons, whatever the prompt asks.

Outputs are deterministic per (prompt ids, sampling_seed, sample index, sim seed); temperature is
ignored. Text comes from fixed corpora sliced at random sentence starts, so there is no per-token Python
work on the hot path: lists are sliced and joined in C.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
import struct
from array import array
from codecs import getincrementaldecoder
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from datagen_operator.engine.sim.config import ModelConfig
from datagen_operator.engine.sim.sampling import SamplingParams
from datagen_operator.engine.sim.tokens import Span, TokenRun
from datagen_operator.engine.sim.vocab import Corpus, SimVocab

KIMI_OLD_OPEN_TAG = "◁think▷"
KIMI_OLD_CLOSE_TAG = "◁/think▷"
_MAX_LENGTH_FACTOR = 20  # cap lognormal draws at 20x the mean


class ThinkingMode(enum.Enum):
    PREFILLED = "prefilled"  # prompt ends with <think>: output is reasoning, </think>, answer
    OFF = "off"  # prompt ends with <think></think>: answer only
    UNPROMPTED = "unprompted"  # any other tail: the model decides


@dataclass(frozen=True, slots=True)
class DeclaredTool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Completion:
    run: TokenRun
    """The completion tokens (what completion_tokens counts), including a matched stop token."""
    finish_reason: dict[str, Any]
    text: str
    """`run` decoded with skip_special_tokens as asked, a matched stop trimmed unless no_stop_trim."""


def prompt_array(prompt_ids: Sequence[int]) -> array:
    """The prompt as a C array: validates ints in [0, 2**32) and makes hashing and searching cheap."""
    return array("I", prompt_ids)


def thinking_mode(prompt_ids: Sequence[int], vocab: SimVocab) -> ThinkingMode:
    if prompt_ids and prompt_ids[-1] == vocab.think_id:
        return ThinkingMode.PREFILLED
    if len(prompt_ids) >= 2 and prompt_ids[-2] == vocab.think_id and prompt_ids[-1] == vocab.think_end_id:
        return ThinkingMode.OFF
    return ThinkingMode.UNPROMPTED


def request_seed(prompt: array, sampling_seed: int | None, sim_seed: int, sample_index: int) -> int:
    digest = hashlib.blake2b(prompt.tobytes(), digest_size=8)
    digest.update(struct.pack("<qqq", sampling_seed or 0, sim_seed, sample_index))
    return int.from_bytes(digest.digest(), "little")


def _find_ids(haystack: array, needle: bytes, start: int = 0) -> int:
    """Index of the id sequence `needle` (array bytes) in `haystack`, or -1; byte search in C."""
    data = haystack.tobytes()
    position = data.find(needle, start * 4)
    while position != -1 and position % 4:
        position = data.find(needle, position + 1)
    return -1 if position == -1 else position // 4


def declared_tools(prompt: array, vocab: SimVocab) -> tuple[DeclaredTool, ...]:
    """Tools the template declared in the prompt (`<|im_system|>tool_declare<|im_middle|>[json]<|im_end|>`)."""
    header = _find_ids(prompt, vocab.marker_bytes)
    if header == -1:
        return ()
    start = header + len(vocab.tool_declare_marker)
    end = _find_ids(prompt, array("I", [vocab.im_end_id]).tobytes(), start)
    try:
        declared = json.loads(vocab.decode(prompt[start : end if end != -1 else len(prompt)]))
    except ValueError:
        return ()
    tools = []
    for entry in declared if isinstance(declared, list) else ():
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            tools.append(DeclaredTool(function["name"], parameters if isinstance(parameters, dict) else {}))
    return tuple(tools)


def draw_length(rng: random.Random, mean: float, sigma: float) -> int:
    """A lognormal length with the given mean (sigma 0: exactly the mean)."""
    if sigma <= 0:
        return max(1, round(mean))
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(round(rng.lognormvariate(mu, sigma)), round(mean * _MAX_LENGTH_FACTOR)))


def take(corpus: Corpus, rng: random.Random, count: int) -> TokenRun:
    """`count` corpus tokens from a random sentence start, wrapping around the corpus."""
    size = len(corpus.source)
    start = corpus.sentence_starts[rng.randrange(len(corpus.sentence_starts))]
    spans = []
    while count > 0:
        stop = min(size, start + count)
        spans.append(Span(corpus.source, start, stop))
        count -= stop - start
        start = 0
    return TokenRun(spans)


def _example_value(rng: random.Random, schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "value"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_example_value(rng, schema.get("items")) for _ in range(rng.randint(0, 2))]
    if kind == "object":
        return example_arguments(rng, schema)
    return rng.choice(("Paris", "Beijing", "latest", "example", "42", "kimi"))


def example_arguments(rng: random.Random, parameters: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit a JSON-schema `parameters` object: all required properties, some optional ones."""
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return {}
    required = set(parameters.get("required") or ())
    return {
        name: _example_value(rng, schema)
        for name, schema in properties.items()
        if name in required or rng.random() < 0.5
    }


def tool_call_section(rng: random.Random, tools: Sequence[DeclaredTool], vocab: SimVocab) -> list[int]:
    """`<|tool_calls_section_begin|>` one or two calls `<|tool_calls_section_end|>` (Kimi-K2 format)."""
    section = [vocab.tool_section_begin_id]
    for index in range(1 if rng.random() < 0.8 else 2):
        tool = rng.choice(tools)
        arguments = json.dumps(example_arguments(rng, tool.parameters), ensure_ascii=False)
        section += [vocab.tool_call_begin_id, *vocab.encode(f"functions.{tool.name}:{index}")]
        section += [vocab.tool_call_argument_begin_id, *vocab.encode(arguments), vocab.tool_call_end_id]
    section.append(vocab.tool_section_end_id)
    return section


def natural_output(
    rng: random.Random,
    mode: ThinkingMode,
    tools: Sequence[DeclaredTool],
    config: ModelConfig,
    vocab: SimVocab,
    min_new_tokens: int = 0,
) -> TokenRun:
    """What the model writes when nothing stops it early; always ends with `<|im_end|>`."""
    thinks = mode is ThinkingMode.PREFILLED or (mode is ThinkingMode.UNPROMPTED and config.unprompted_thinking)
    if config.misconfig == "ignore-thinking":
        thinks = False
    opener = TokenRun()
    closer = vocab.single(vocab.think_end_id)
    if config.misconfig == "kimi-tags":
        closer = vocab.run(vocab.encode(KIMI_OLD_CLOSE_TAG))
        if mode is ThinkingMode.UNPROMPTED:
            opener = vocab.run(vocab.encode(KIMI_OLD_OPEN_TAG))
    elif mode is ThinkingMode.UNPROMPTED:
        opener = vocab.single(vocab.think_id)
    if config.misconfig == "never-close-think":
        closer = TokenRun()

    parts: list[TokenRun] = []
    if thinks:
        reasoning = take(vocab.reasoning, rng, draw_length(rng, config.mean_reasoning_tokens, config.length_sigma))
        parts += (opener, reasoning, closer)
    calls_tool = bool(tools) and rng.random() < config.tool_call_rate
    answer_mean = min(config.mean_answer_tokens, 40.0) if calls_tool else config.mean_answer_tokens
    answer_length = draw_length(rng, answer_mean, config.length_sigma)
    section = vocab.run(tool_call_section(rng, tools, vocab)) if calls_tool else TokenRun()
    # min_new_tokens suppresses the stop token until reached: the answer grows to fit.
    answer_length = max(answer_length, min_new_tokens - sum(map(len, parts)) - len(section) - 1)
    parts += (take(vocab.answer, rng, answer_length), section, vocab.single(vocab.im_end_id))
    return TokenRun.concat(parts)


def _first_stop_string(
    run: TokenRun, stops: Sequence[str], vocab: SimVocab, skip_special: bool
) -> tuple[int, str, int] | None:
    """(index of the token completing the earliest stop string, the string, its char offset) or None."""
    text = run.text(skip_special)
    found = [(position + len(stop), position, stop) for stop in stops if (position := text.find(stop)) != -1]
    if not found:
        return None
    end, position, stop = min(found)
    table = vocab.text_bytes if skip_special else vocab.token_bytes
    decoder = getincrementaldecoder("utf-8")("replace")
    decoded = 0
    ids = run.ids()
    for index, token_id in enumerate(ids):
        decoded += len(decoder.decode(table[token_id]))
        if decoded >= end:
            return index, stop, position
    return len(ids) - 1, stop, position


def finish_output(natural: TokenRun, params: SamplingParams, vocab: SimVocab, max_new_tokens: int) -> Completion:
    """Cut the natural output where SGLang would: length first, then stop tokens, then stop strings."""
    window = natural.prefix(max_new_tokens)
    skip = params.skip_special_tokens
    token_stop = None
    if not params.ignore_eos:
        # min_new_tokens masks stop tokens until reached (SGLang's min-new-tokens penalizer).
        stop_ids = vocab.eos_ids | params.stop_token_ids
        token_stop = window.find_first(stop_ids, max(0, params.min_new_tokens - 1))
    string_stop = _first_stop_string(window, params.stop, vocab, skip) if params.stop else None
    if string_stop is not None and (token_stop is None or string_stop[0] < token_stop[0]):
        index, stop, char_offset = string_stop
        if index + 1 < max_new_tokens:
            run = window.prefix(index + 1)
            text = run.text(skip) if params.no_stop_trim else window.text(skip)[:char_offset]
            return Completion(run, {"type": "stop", "matched": stop}, text)
    elif token_stop is not None and token_stop[0] + 1 < max_new_tokens:
        index, stop_id = token_stop
        run = window.prefix(index + 1)
        text = run.text(skip) if params.no_stop_trim else window.prefix(index).text(skip)
        return Completion(run, {"type": "stop", "matched": stop_id}, text)
    return Completion(window, {"type": "length", "length": max_new_tokens}, window.text(skip))


def complete(
    prompt: array,
    params: SamplingParams,
    sample_index: int,
    config: ModelConfig,
    vocab: SimVocab,
    max_new_tokens: int,
) -> Completion:
    """The model's completion of `prompt` (already validated), cut at `max_new_tokens` (already clamped)."""
    rng = random.Random(request_seed(prompt, params.sampling_seed, config.seed, sample_index))
    mode = thinking_mode(prompt, vocab)
    tools = declared_tools(prompt, vocab)
    natural = natural_output(rng, mode, tools, config, vocab, params.min_new_tokens)
    if params.ignore_eos and len(natural) < max_new_tokens:
        natural += take(vocab.answer, rng, max_new_tokens - len(natural))  # it talks on past <|im_end|>
    return finish_output(natural, params, vocab, max_new_tokens)


def aborted(completion: Completion, message: str, status_code: int) -> Completion:
    """The first half of a completion with an abort finish reason (an aborted request)."""
    run = completion.run.prefix(len(completion.run) // 2)
    return Completion(run, {"type": "abort", "message": message, "status_code": status_code}, run.text())
