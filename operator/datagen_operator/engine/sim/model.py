"""The simulated model: a pure function from (prompt ids, sampling params, seeds) to its family's output tokens.

What it writes (the family's ChatFormat, tokenizer/families.py): when the prompt tail opened reasoning (Kimi's
`<think>`, Qwen3-2507's and DeepSeek-R1's `<think>` + newline), reasoning tokens, the closer (`</think>`,
`\n</think>\n\n`, ...), an answer, sometimes a tool call in the family's format when the prompt declared tools,
then the stop token. With an empty reasoning block at the tail (thinking off) the answer comes directly. Any
other tail: the model decides; a thinking model opens reasoning itself (`<think>`, or harmony's analysis
channel) unless `unprompted_thinking` is off. Harmony (gpt-oss): `<|channel|>analysis<|message|>` reasoning
`<|end|><|start|>assistant<|channel|>final<|message|>` answer `<|return|>`, or a commentary-channel tool
call ending `<|call|>`.

Misconfigured models (`--sim-misconfig`), for every reasoning family: `never-close-think` writes reasoning and
answer with no closer (harmony: no `<|end|>` and no final-channel header after the analysis); `ignore-thinking`
never reasons, whatever the prompt asks (harmony: no analysis channel); `kimi-tags` writes the old Kimi
format's `◁think▷`/`◁/think▷` as text instead of the family's reasoning markers.

Which output a request gets follows SGLang 0.5.23's sampler (`request_rng`): greedy requests the same one each
time; under --enable-deterministic-inference one per (prompt ids, sampling_seed or 42, sim seed); otherwise a
fresh draw per request, whatever its sampling_seed. Temperature changes nothing else. Text comes from fixed corpora sliced at random sentence starts, so there is no per-token Python
work on the hot path: lists are sliced and joined in C.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import random
import secrets
import struct
from array import array
from bisect import bisect_left
from codecs import getincrementaldecoder
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from datagen_operator.engine.sim import formats
from datagen_operator.engine.sim.config import ModelConfig
from datagen_operator.engine.sim.formats import DeclaredTool, ToolCall
from datagen_operator.engine.sim.sampling import SamplingParams
from datagen_operator.engine.sim.tokens import Span, TokenRun
from datagen_operator.engine.sim.vocab import Corpus, SimVocab

_MAX_LENGTH_FACTOR = 20  # cap lognormal draws at 20x the mean
_START_DRAWS = 16  # a cut inside a character is rare (emoji in 1 answer sentence of 20): 16 draws all but end it


class ThinkingMode(enum.Enum):
    PREFILLED = "prefilled"  # the prompt opened reasoning: output is reasoning, closer, answer
    OFF = "off"  # the prompt ends with an empty reasoning block: answer only
    UNPROMPTED = "unprompted"  # any other tail: the model decides


@dataclass(frozen=True, slots=True)
class Completion:
    run: TokenRun
    """The completion tokens (what completion_tokens counts), including a matched stop token."""
    finish_reason: dict[str, Any]
    text: str
    """`run` decoded with skip_special_tokens as asked, a matched stop trimmed unless no_stop_trim."""


def prompt_array(prompt_ids: Sequence[int]) -> array[int]:
    """The prompt as a C array: validates ints in [0, 2**32) and makes hashing and searching cheap."""
    return array("I", prompt_ids)


def _ends_with(prompt: array[int], tail: array[int]) -> bool:
    return len(prompt) >= len(tail) and prompt[len(prompt) - len(tail) :] == tail


def thinking_mode(prompt_ids: Sequence[int], vocab: SimVocab) -> ThinkingMode:
    """What the family's prompt tail asks for (Qwen3-2507's opener is followed by a newline token)."""
    prompt = prompt_ids if isinstance(prompt_ids, array) else prompt_array(prompt_ids)
    if any(_ends_with(prompt, tail) for tail in vocab.runs.prefill_tails):
        return ThinkingMode.PREFILLED
    # An empty reasoning block, or any prompt that ends by closing the reasoning: the model answers.
    closer = vocab.runs.think_end_id
    if any(_ends_with(prompt, tail) for tail in vocab.runs.off_tails) or (prompt and prompt[-1] == closer):
        return ThinkingMode.OFF
    return ThinkingMode.UNPROMPTED


def request_seed(prompt: array[int], sampling_seed: int, sim_seed: int) -> int:
    digest = hashlib.blake2b(prompt.tobytes(), digest_size=8)
    digest.update(struct.pack("<qqq", sampling_seed, sim_seed, 0))  # the third: kept so outputs stay as they were
    return int.from_bytes(digest.digest(), "little")


GREEDY_SEED = 0
"""The stand-in seed of a greedy request: argmax needs none, so every greedy request of a prompt is the same."""


def request_rng(prompt: array[int], params: SamplingParams, config: ModelConfig) -> random.Random:
    """What decides a request's output, as in SGLang 0.5.23: a greedy request (temperature ~0 or top_k 1) is the
    argmax, the same each time; `SamplingBatchInfo.from_schedule_batch` passes sampling seeds to the sampler only
    under --enable-deterministic-inference (an unseeded request then gets 42), and `multinomial_with_seed` makes
    each token a function of seed and position; otherwise `torch.multinomial` draws anew for every request, so
    the samples of one prompt differ, sampling_seed or not. Samples of a parallel request (`n`) are requests of
    their own: alike under a seed, drawn apart without one."""
    if params.greedy:
        return random.Random(request_seed(prompt, GREEDY_SEED, config.seed))
    if config.default_sampling_seed is not None:
        seed = params.sampling_seed if params.sampling_seed is not None else config.default_sampling_seed
        return random.Random(request_seed(prompt, seed, config.seed))
    return random.Random(secrets.randbits(64))


def _holds(prompt: array[int], needle: array[int]) -> bool:
    """Whether `prompt` holds the id sequence `needle`: a byte search in C, aligned to whole ids."""
    data, pattern = prompt.tobytes(), needle.tobytes()
    position = data.find(pattern)
    while position != -1 and position % needle.itemsize:
        position = data.find(pattern, position + 1)
    return position != -1


def declared_tools(prompt: array[int], vocab: SimVocab) -> tuple[DeclaredTool, ...]:
    """Tools the family's template declared in the prompt. Decoding the prompt costs about 0.1 us a token, so
    it is decoded only when it holds the ids every tool declaration holds."""
    gate = vocab.runs.tool_gate
    if gate and not _holds(prompt, gate):
        return ()
    return formats.declared_tools(vocab.chat, vocab.decode(prompt, skip_special_tokens=False))


def draw_length(rng: random.Random, mean: float, sigma: float) -> int:
    """A lognormal length with the given mean (sigma 0: exactly the mean)."""
    if sigma <= 0:
        return max(1, round(mean))
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(round(rng.lognormvariate(mu, sigma)), round(mean * _MAX_LENGTH_FACTOR)))


def take(corpus: Corpus, rng: random.Random, count: int) -> TokenRun:
    """`count` corpus tokens from a random sentence start, wrapping around the corpus. A start whose cut would end
    inside a character is drawn again: a model does not stop (or close its reasoning) halfway through an emoji's
    bytes, and the length stays the one drawn."""
    size = len(corpus.source)
    for _ in range(_START_DRAWS):
        start = corpus.sentence_starts[rng.randrange(len(corpus.sentence_starts))]
        if (start + count) % size not in corpus.inside_character:
            break
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


def tool_calls(rng: random.Random, tools: Sequence[DeclaredTool], single: bool) -> list[ToolCall]:
    """One call, sometimes two (when the format allows several per turn), with arguments fitting the schemas."""
    count = 1 if single or rng.random() < 0.8 else 2
    chosen = [rng.choice(tools) for _ in range(count)]
    return [ToolCall(tool.name, example_arguments(rng, tool.parameters)) for tool in chosen]


def natural_output(
    rng: random.Random,
    mode: ThinkingMode,
    tools: Sequence[DeclaredTool],
    config: ModelConfig,
    vocab: SimVocab,
    min_new_tokens: int = 0,
) -> TokenRun:
    """What the model writes when nothing stops it early; always ends with the family's stop token."""
    chat, runs = vocab.chat, vocab.runs
    reasons = chat.reasoning != "none" and config.misconfig != "ignore-thinking"
    thinks = reasons and (
        mode is ThinkingMode.PREFILLED
        or (mode is ThinkingMode.UNPROMPTED and config.unprompted_thinking and chat.thinks_unprompted)
    )
    opener = runs.think_open if mode is ThinkingMode.UNPROMPTED else TokenRun()
    closer = runs.think_close
    if config.misconfig == "kimi-tags":
        opener = runs.old_open if mode is ThinkingMode.UNPROMPTED else TokenRun()
        closer = runs.old_close
    if config.misconfig == "never-close-think":
        closer = TokenRun()

    parts: list[TokenRun] = []
    if thinks:
        reasoning = take(vocab.reasoning, rng, draw_length(rng, config.mean_reasoning_tokens, config.length_sigma))
        parts += (opener, reasoning, closer)
    # Harmony opens the answer as a new message (think-tag formats write nothing here); a model that never
    # ended its reasoning goes on in the same message.
    if not thinks:
        leads = runs.answer_open_first
    elif len(closer):
        leads = runs.answer_open
    else:
        leads = TokenRun()
    calls_tool = bool(tools) and rng.random() < config.tool_call_rate
    answer_mean = min(config.mean_answer_tokens, 40.0) if calls_tool else config.mean_answer_tokens
    answer_length = draw_length(rng, answer_mean, config.length_sigma)
    section, stop = TokenRun(), runs.answer_stop
    if calls_tool:
        single = chat.tool_call_format in formats.SINGLE_CALL_FORMATS
        text = formats.write_tool_calls(chat, tool_calls(rng, tools, single), first=not parts)
        section, stop = vocab.run(vocab.encode(text)), runs.tool_stop
        if single:  # harmony: the call is the next message, in place of the final answer
            leads, answer_length = TokenRun(), 0
    # min_new_tokens suppresses the stop token until reached: the answer grows to fit.
    fixed = sum(map(len, parts)) + len(leads) + len(section) + len(stop)
    answer_length = max(answer_length, min_new_tokens - fixed)
    parts += (leads, take(vocab.answer, rng, answer_length), section, stop)
    return TokenRun.concat(parts)


def _first_stop_string(
    run: TokenRun, stops: Sequence[str], vocab: SimVocab, skip_special: bool
) -> tuple[int, str, int] | None:
    """(index of the first token that completes a stop string, the string, its char offset) or None. Of the
    strings that token completes, the first listed: SGLang checks each new token's tail for `stops` in order."""
    text = run.text(skip_special)
    found = [
        (position + len(stop), order, position)
        for order, stop in enumerate(stops)
        if (position := text.find(stop)) != -1
    ]
    if not found:
        return None
    table = vocab.text_bytes if skip_special else vocab.token_bytes
    decoder = getincrementaldecoder("utf-8")("replace")
    decoded = list(accumulate(len(decoder.decode(table[token_id])) for token_id in run.ids()))
    # The token whose text reaches a string's end completes it (at most the last token: text is their join).
    index, order, position = min(
        (min(bisect_left(decoded, end), len(decoded) - 1), order, position) for end, order, position in found
    )
    return index, stops[order], position


def finish_output(
    natural: TokenRun, params: SamplingParams, vocab: SimVocab, max_new_tokens: int, kept_stop_id: int | None = None
) -> Completion:
    """Cut the natural output where SGLang would. Its checks after each token (`Req.update_finish_state`): a stop
    string the token completes, then a stop token, then the length; so a stop on the max_new_tokens-th token
    is a stop, not a length finish.

    A matched stop token is trimmed from `text` unless no_stop_trim, or it is `kept_stop_id` (SGLang keeps
    gpt-oss's `<|call|>` for the tool-call parser)."""
    window = natural.prefix(max_new_tokens)
    skip = params.skip_special_tokens
    token_stop = None
    if not params.ignore_eos:
        # min_new_tokens masks stop tokens until reached (SGLang's min-new-tokens penalizer).
        stop_ids = vocab.eos_ids | params.stop_token_ids
        token_stop = window.find_first(stop_ids, max(0, params.min_new_tokens - 1))
    string_stop = _first_stop_string(window, params.stop, vocab, skip) if params.stop else None
    if string_stop is not None and (token_stop is None or string_stop[0] <= token_stop[0]):
        index, stop, char_offset = string_stop
        run = window.prefix(index + 1)
        text = run.text(skip) if params.no_stop_trim else window.text(skip)[:char_offset]
        return Completion(run, {"type": "stop", "matched": stop}, text)
    if token_stop is not None:
        index, stop_id = token_stop
        run = window.prefix(index + 1)
        trimmed = not params.no_stop_trim and stop_id != kept_stop_id
        text = window.prefix(index).text(skip) if trimmed else run.text(skip)
        return Completion(run, {"type": "stop", "matched": stop_id}, text)
    return Completion(window, {"type": "length", "length": max_new_tokens}, window.text(skip))


def complete(
    prompt: array[int],
    params: SamplingParams,
    config: ModelConfig,
    vocab: SimVocab,
    max_new_tokens: int,
) -> Completion:
    """The model's completion of `prompt` (already validated), cut at `max_new_tokens` (already clamped)."""
    rng = request_rng(prompt, params, config)
    mode = thinking_mode(prompt, vocab)
    tools = declared_tools(prompt, vocab)
    if config.answer_tokens_per_prompt_token > 0:
        config = dataclasses.replace(config, mean_answer_tokens=config.answer_tokens_per_prompt_token * len(prompt))
    natural = natural_output(rng, mode, tools, config, vocab, params.min_new_tokens)
    if params.ignore_eos and len(natural) < max_new_tokens:
        natural += take(vocab.answer, rng, max_new_tokens - len(natural))  # it talks on past its stop token
    return finish_output(natural, params, vocab, max_new_tokens, config.kept_stop_id)


NAN_MATCHED = "NaN happened"
"""SGLang 0.5.23's `finish_reason.matched` when a sampled id falls outside the vocabulary."""


def nan_guarded(completion: Completion, stop_token_ids: frozenset[int], vocab: SimVocab) -> Completion:
    """What SGLang's `Req._check_vocab_boundary_finish` makes of an id sampled outside the vocabulary halfway
    through: that id replaced by the request's first stop id, then by the model's first eos id when it has one;
    the answer ends there with `{"type": "stop", "matched": "NaN happened"}`."""
    keep = len(completion.run) // 2
    eos, stops = vocab.eos_ids, stop_token_ids
    replacement = next(iter(eos)) if eos else next(iter(stops)) if stops else None
    if replacement is None:
        return completion  # nothing to write in its place: SGLang would emit the bad id; not simulated
    run = completion.run.prefix(keep) + vocab.single(replacement)
    return Completion(run, {"type": "stop", "matched": NAN_MATCHED}, completion.run.prefix(keep).text())


def aborted(completion: Completion, message: str, status_code: int) -> Completion:
    """The first half of a completion with an abort finish reason (an aborted request)."""
    run = completion.run.prefix(len(completion.run) // 2)
    return Completion(run, {"type": "abort", "message": message, "status_code": status_code}, run.text())
