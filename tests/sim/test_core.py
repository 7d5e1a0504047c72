"""The simulator's pure core, without HTTP: token runs, parsers, faults, sampling validation, the model."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from datagen_operator.engine.reasoning import split_reasoning
from datagen_operator.engine.sim.config import FaultConfig, ModelConfig
from datagen_operator.engine.sim.faults import NO_FAULTS, plan_faults
from datagen_operator.engine.sim.model import (
    ThinkingMode,
    complete,
    declared_tools,
    draw_length,
    prompt_array,
    take,
    thinking_mode,
)
from datagen_operator.engine.sim.sampling import SamplingParamsError, parse_sampling_params
from datagen_operator.engine.sim.tokens import Span, TokenRun, TokenSource
from datagen_operator.engine.sim.vocab import SimVocab, load_vocab
from datagen_operator.engine.tool_calls import read_tool_calls
from tests.sim.prompts import IM_END, THINK, THINK_END, WEATHER_TOOL, chat_prompt, decode


@pytest.fixture(scope="module")
def vocab(standin_tokenizer: Path) -> SimVocab:
    return load_vocab(standin_tokenizer)


# -- token runs behave like the lists they stand for --------------------------------------------


def test_token_runs_match_plain_lists(vocab: SimVocab) -> None:
    rng = random.Random(0)
    sources = [vocab.reasoning.source, vocab.answer.source, vocab.source([IM_END, THINK_END, 5, 163700])]
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(0, 4)):
            source = rng.choice(sources)
            start = rng.randrange(len(source))
            spans.append(Span(source, start, rng.randint(start, min(len(source), start + 50))))
        run = TokenRun(spans)
        expected = [token for span in spans for token in span.source.ids[span.start : span.stop]]
        assert run.ids() == expected and len(run) == len(expected)
        cut = rng.randint(0, len(expected) + 2)
        assert run.prefix(cut).ids() == expected[:cut]
        for skip in (True, False):
            assert run.text(skip) == decode(expected, skip_special_tokens=skip)
        assert json.loads(b"[" + run.json_ids() + b"]") == expected
        wanted = {IM_END, THINK_END, rng.choice(expected) if expected else 1}
        start = rng.randint(0, len(expected))
        hits = [(index, token) for index, token in enumerate(expected) if token in wanted and index >= start]
        assert run.find_first(wanted, start) == (min(hits) if hits else None)


def test_token_source_encodings(vocab: SimVocab) -> None:
    source = TokenSource.build([163606, 100, 163586], vocab.token_bytes, vocab.text_bytes)
    assert source.raw.endswith(b"<|im_end|>") and not source.text.endswith(b"<|im_end|>")
    assert source.json == b"163606,100,163586,"


# -- reasoning parsers --------------------------------------------------------------------------

OUT = "plan it</think> the answer"


@pytest.mark.parametrize(
    ("text", "parser", "forced", "reasoning", "content"),
    [
        (OUT, None, True, None, OUT),
        (OUT, "kimi_k2", True, "plan it", " the answer"),  # SGLang 0.5.23 strips neither part
        (OUT, "kimi_k2", False, None, OUT),
        ("<think>plan</think>answer", "kimi_k2", False, "plan", "answer"),
        (OUT, "qwen3", True, "plan it", " the answer"),
        (OUT, "deepseek-r1", False, "plan it", " the answer"),
        ("just an answer", "deepseek-r1", False, "just an answer", ""),
        ("just an answer", "qwen3-thinking", False, "just an answer", ""),
        ("just an answer", "qwen3", False, None, "just an answer"),
        (OUT, "kimi", True, None, OUT),
        ("◁think▷old◁/think▷new", "kimi", False, "old", "new"),
        ("still thinking", "kimi_k2", True, "still thinking", ""),
        ("plan<|tool_calls_section_begin|>calls", "kimi_k2", True, "plan", "<|tool_calls_section_begin|>calls"),
        ("plan<|tool_calls_section_begin|>calls", "qwen3", True, "plan<|tool_calls_section_begin|>calls", ""),
        (OUT, "gpt-oss", True, None, ""),  # harmony finds no channel, so nothing at all
    ],
)
def test_split_reasoning(text: str, parser: str | None, forced: bool, reasoning: str | None, content: str) -> None:
    split = split_reasoning(text, parser, forced)
    assert (split.reasoning, split.content) == (reasoning, content)


def test_kimi_k2_tool_call_parser() -> None:
    text = (
        "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.search:1'
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
    )
    split = read_tool_calls("kimi_k2", text, [WEATHER_TOOL])
    assert split.normal_text == "Checking."
    assert [(call.name, call.arguments) for call in split.calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("search", "{}"),  # the name comes from the call id, declared or not
    ]
    assert read_tool_calls("kimi_k2", "no calls", [WEATHER_TOOL]).calls == []


# -- faults -------------------------------------------------------------------------------------


def test_fault_plans_are_reproducible_and_follow_the_rates() -> None:
    assert plan_faults(FaultConfig(), 1) is NO_FAULTS
    always = FaultConfig(error_5xx_rate=1.0, reset_rate=1.0, error_5xx_status=502)
    assert all(plan_faults(always, number).http_status == 502 for number in range(1, 50))
    assert not any(plan_faults(always, number).reset for number in range(1, 50)), "5xx wins over reset"
    some = FaultConfig(seed=3, reset_rate=0.3, hang_s=5, hang_rate=0.5)
    plans = [plan_faults(some, number) for number in range(1, 2001)]
    assert plans == [plan_faults(some, number) for number in range(1, 2001)]
    assert 500 < sum(plan.reset for plan in plans) < 700
    assert 900 < sum(plan.hang_s == 5 for plan in plans) < 1100
    other_seed = [plan_faults(FaultConfig(seed=4, reset_rate=0.3), n).reset for n in range(1, 2001)]
    assert other_seed != [plan.reset for plan in plans]


# -- sampling params ----------------------------------------------------------------------------


def test_sampling_params_defaults_and_parsing() -> None:
    assert parse_sampling_params(None).max_new_tokens == 128
    assert parse_sampling_params({}).max_new_tokens == 128
    params = parse_sampling_params(
        {"max_new_tokens": 9, "stop": "x", "stop_token_ids": [5], "ignore_eos": True, "sampling_seed": 3, "n": 2}
    )
    assert (params.max_new_tokens, params.stop, params.stop_token_ids) == (9, ("x",), frozenset({5}))
    assert params.ignore_eos and params.sampling_seed == 3 and params.n == 2


@pytest.mark.parametrize(
    ("raw", "flat"),
    [
        ({"max_tokens": 1}, True),
        ({"max_new_tokens": 1.0}, True),
        ({"max_new_tokens": True}, True),
        ({"temperature": "hot"}, True),
        ({"top_p": 1.5}, False),
        ({"min_p": -0.1}, False),
        ({"repetition_penalty": 2.5}, False),
        ({"stop": [1]}, True),
        ({"ignore_eos": "yes"}, True),
        ({"top_k": 0}, False),
        ([1, 2], True),
    ],
)
def test_sampling_params_errors_and_their_body_shape(raw: object, flat: bool) -> None:
    with pytest.raises(SamplingParamsError) as caught:
        parse_sampling_params(raw)
    assert caught.value.flat is flat
    body = caught.value.body()
    assert isinstance(body["error"], str) if flat else isinstance(body["error"]["message"], str)


# -- the model ----------------------------------------------------------------------------------


def test_thinking_mode_from_the_prompt_tail(vocab: SimVocab) -> None:
    assert thinking_mode(chat_prompt(thinking=True), vocab) is ThinkingMode.PREFILLED
    assert thinking_mode(chat_prompt(thinking=False), vocab) is ThinkingMode.OFF
    assert thinking_mode([1, 2, 3], vocab) is ThinkingMode.UNPROMPTED


def test_declared_tools_are_read_from_the_prompt(vocab: SimVocab) -> None:
    tools = declared_tools(prompt_array(chat_prompt(tools=[WEATHER_TOOL])), vocab)
    assert [tool.name for tool in tools] == ["get_weather"]
    assert tools[0].parameters["required"] == ["city"]
    assert declared_tools(prompt_array(chat_prompt()), vocab) == ()


def test_draw_length() -> None:
    rng = random.Random(1)
    assert draw_length(rng, 123, 0) == 123
    draws = [draw_length(rng, 500, 0.8) for _ in range(5000)]
    assert 450 < statistics.mean(draws) < 550 and statistics.median(draws) < 500


def test_a_corpus_slice_never_ends_inside_a_character(vocab: SimVocab) -> None:
    """A model stops, or closes its reasoning, between characters: every slice of the answer corpus (whose emoji
    span several tokens) decodes to whole UTF-8 characters, at the length drawn."""
    assert len(vocab.answer.inside_character) > 100  # cuts that would split an emoji exist: the test can fail
    rng = random.Random(0)
    for draw in range(4000):
        count = 1 + draw % 400
        run = take(vocab.answer, rng, count)
        assert len(run) == count
        run.decoded_bytes(skip_special_tokens=False).decode("utf-8")  # strict: a split character raises


def test_completion_structure_and_misconfigs(vocab: SimVocab) -> None:
    prompt = prompt_array(chat_prompt())
    params = parse_sampling_params({"max_new_tokens": 100_000})

    def ids(**config: object) -> list[int]:
        # Seeded, as under --enable-deterministic-inference: the same prompt gives the same output.
        model = ModelConfig(mean_answer_tokens=50, mean_reasoning_tokens=50, default_sampling_seed=42, **config)
        return complete(prompt, params, model, vocab, 100_000).run.ids()

    normal = ids()
    assert THINK not in normal and normal.count(THINK_END) == 1 and normal[-1] == IM_END
    assert THINK_END not in ids(misconfig="never-close-think")
    assert THINK_END not in ids(misconfig="ignore-thinking") and len(ids(misconfig="ignore-thinking")) < len(normal)
    assert "◁/think▷" in decode(ids(misconfig="kimi-tags"))
    assert ids() == normal and ids(seed=1) != normal


def test_the_models_eos_ids_come_from_the_model_directory(standin_tokenizer: Path, tmp_path: Path) -> None:
    # As SGLang: configs from --model-path, the tokenizer (and its eos) from --tokenizer-path.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "eos_token_id": 11}))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [12, 13]}))
    plain = load_vocab(standin_tokenizer)
    split = load_vocab(standin_tokenizer, model_dir=model_dir)
    config_eos = json.loads((standin_tokenizer / "config.json").read_text())["eos_token_id"]
    assert {11, 12, 13} <= split.eos_ids and not {11, 12, 13} & plain.eos_ids
    assert config_eos in plain.eos_ids
