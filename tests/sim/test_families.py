"""The simulator per model family: raw-token output shapes per thinking mode, misconfigurations, tool calls, the
chat split, and how it finds the family of a tokenizer directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.engine.sim.chat import chat_choice, parse_chat_request
from datagen_operator.engine.sim.config import ModelConfig
from datagen_operator.engine.sim.model import ThinkingMode, complete, prompt_array, thinking_mode
from datagen_operator.engine.sim.vocab import SimVocab, VocabError, load_vocab
from datagen_operator.engine.tool_calls import GPT_OSS_CALL_ID
from datagen_operator.presets import Preset, presets
from datagen_operator.tokenizer.chat_template import render_chat
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer
from tests.harness.sim import start_sims
from tests.sim.http import post

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
]
THINKING = [name for name, preset in sorted(presets().items()) if preset.thinking.supported]
SWITCHABLE = [name for name in THINKING if presets()[name].thinking.switch is not None]
_VOCABS: dict[str, SimVocab] = {}


def vocab_for(preset: Preset) -> SimVocab:
    if preset.family not in _VOCABS:
        _VOCABS[preset.family] = load_vocab(ensure_standin_tokenizer(family=preset.family))
    return _VOCABS[preset.family]


def ids_of(vocab: SimVocab, text: str) -> list[int]:
    return vocab.encode(text)


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def generate(
    preset: Preset, thinking: bool | None = None, tools: bool = False, **config: Any
) -> tuple[SimVocab, list[int], list[int]]:
    """(vocab, prompt ids, output ids) of one completion of a prompt rendered by the preset's stand-in template."""
    vocab = vocab_for(preset)
    switch = {preset.thinking.switch: thinking} if thinking is not None and preset.thinking.switch else {}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = vocab.encode(render_chat(vocab.chat_template or "", messages, tools=TOOLS if tools else None, **switch))
    body = {"messages": messages, "max_tokens": 5000}
    params = parse_chat_request(body).params
    # Seeded (--enable-deterministic-inference): a test that completes the prompt again gets the same output.
    settings = {"mean_reasoning_tokens": 30.0, "mean_answer_tokens": 20.0, "length_sigma": 0.0,
                "default_sampling_seed": 42, **config}  # fmt: skip
    completion = complete(prompt_array(prompt), params, ModelConfig(**settings), vocab, 5000)
    return vocab, prompt, completion.run.ids()


def stop_ids(preset: Preset) -> set[int]:
    return {token.id for token in preset.stop_tokens if token.id is not None}


@pytest.mark.parametrize("name", sorted(presets()))
def test_default_output_shape(name: str) -> None:
    preset = presets()[name]
    vocab, prompt, output = generate(preset)
    chat = vocab.chat
    assert output[-1] in stop_ids(preset) and output[-1] in vocab.eos_ids
    close = ids_of(vocab, chat.think_close) if chat.think_close else []
    if chat.reasoning == "none":
        assert thinking_mode(prompt, vocab) is ThinkingMode.UNPROMPTED
        assert preset.think_end is None and not any(token in output for token in vocab.runs.think_close.ids())
        return
    assert contains(output, close)
    if preset.thinking.prompt_prefills_opener:
        assert thinking_mode(prompt, vocab) is ThinkingMode.PREFILLED
        assert not contains(output, ids_of(vocab, chat.think_open)), "the opener is the prompt's, not the output's"
    else:
        assert thinking_mode(prompt, vocab) is ThinkingMode.UNPROMPTED
        assert output[: len(vocab.runs.think_open)] == vocab.runs.think_open.ids(), "the model opens reasoning"
    if chat.reasoning == "harmony":
        final = ids_of(vocab, chat.think_close + chat.answer_open)
        assert contains(output, final) and output[-1] == vocab.family.token_id("<|return|>")


@pytest.mark.parametrize("name", SWITCHABLE)
def test_thinking_off_has_no_reasoning(name: str) -> None:
    preset = presets()[name]
    vocab, prompt, output = generate(preset, thinking=False)
    assert thinking_mode(prompt, vocab) is ThinkingMode.OFF
    assert preset.think_end is not None and preset.think_end.id not in output
    assert preset.think_start is not None and preset.think_start.id not in output


@pytest.mark.parametrize("name", THINKING)
def test_a_prompt_that_closes_the_reasoning_gets_the_answer_only(name: str) -> None:
    """The canary's control: the same prompt with the closer appended (thinking told to stop)."""
    preset = presets()[name]
    vocab, prompt, _ = generate(preset)
    closed = [*prompt, vocab.runs.think_end_id]
    assert thinking_mode(closed, vocab) is ThinkingMode.OFF
    for misconfig in (None, "never-close-think"):
        config = ModelConfig(mean_reasoning_tokens=300, mean_answer_tokens=20, length_sigma=0, misconfig=misconfig)
        params = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}).params
        answer = complete(prompt_array(closed), params, config, vocab, 5000).run
        opened = complete(prompt_array(prompt), params, config, vocab, 5000).run
        assert len(answer) < 60 < 300 < len(opened)


def test_qwen3_2507_reads_the_opener_before_the_newline_token() -> None:
    preset = presets()["qwen3-thinking-2507"]
    vocab, prompt, output = generate(preset)
    assert prompt[-2:] == [151667, vocab.encode("\n")[0]]
    assert thinking_mode(prompt, vocab) is ThinkingMode.PREFILLED and 151667 not in output and 151668 in output


@pytest.mark.parametrize("name", THINKING)
def test_never_close_think(name: str) -> None:
    preset = presets()[name]
    vocab, _, output = generate(preset, misconfig="never-close-think")
    closer = vocab.runs.think_end_id
    assert closer is not None and closer not in output
    assert output[-1] in stop_ids(preset)


@pytest.mark.parametrize("name", THINKING)
def test_ignore_thinking(name: str) -> None:
    preset = presets()[name]
    vocab, _, natural = generate(preset)
    _, _, output = generate(preset, misconfig="ignore-thinking")
    assert vocab.runs.think_end_id in natural and vocab.runs.think_end_id not in output
    assert len(output) < len(natural), "no reasoning written"
    if vocab.chat.reasoning == "harmony":  # no analysis channel: the output opens the final channel directly
        assert output[: len(vocab.runs.answer_open_first)] == vocab.runs.answer_open_first.ids()
    else:
        assert not contains(output, ids_of(vocab, vocab.chat.think_open))


@pytest.mark.parametrize("name", [name for name in THINKING if presets()[name].reasoning_format == "think-tags"])
def test_kimi_tags(name: str) -> None:
    vocab, _, output = generate(presets()[name], misconfig="kimi-tags")
    assert "◁/think▷" in vocab.decode(output) and vocab.runs.think_end_id not in output


@pytest.mark.parametrize("name", sorted(presets()))
def test_tool_calls_in_the_family_format_and_parsed_back(name: str) -> None:
    preset = presets()[name]
    kept = GPT_OSS_CALL_ID if preset.tool_call_parser == "gpt-oss" else None
    vocab, prompt, output = generate(preset, tools=True, tool_call_rate=1.0, kept_stop_id=kept)
    for begin, _ in preset.tool_call_markers:
        assert begin.id is None or begin.id in output
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "max_tokens": 5000}
    request = parse_chat_request(body, vocab)
    assert request.params.skip_special_tokens is False, "SGLang keeps special tokens when tools are declared"
    completion = complete(
        prompt_array(prompt),
        request.params,
        ModelConfig(
            mean_reasoning_tokens=30,
            mean_answer_tokens=20,
            length_sigma=0,
            tool_call_rate=1.0,
            kept_stop_id=kept,
            default_sampling_seed=42,
        ),
        vocab,
        5000,
    )
    assert completion.run.ids() == output
    choice = chat_choice(completion, request, vocab, preset.reasoning_parser, preset.tool_call_parser)
    assert choice.tool_calls and choice.finish_reason == "tool_calls"
    for call in choice.tool_calls:
        arguments = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "get_weather" and isinstance(arguments["days"], int)
    assert "tool_call" not in (choice.content or "") and "<|" not in (choice.content or "")
    if preset.reasoning_parser is not None:
        assert choice.reasoning and "</think>" not in choice.reasoning and "<|end|>" not in choice.reasoning
    else:
        assert choice.reasoning is None


@pytest.mark.parametrize("name", sorted(presets()))
def test_chat_split_of_a_plain_answer(name: str) -> None:
    preset = presets()[name]
    vocab = vocab_for(preset)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5000}
    request = parse_chat_request(body, vocab)
    prompt = vocab.encode(render_chat(vocab.chat_template or "", request.messages))
    completion = complete(prompt_array(prompt), request.params, ModelConfig(length_sigma=0), vocab, 5000)
    choice = chat_choice(completion, request, vocab, preset.reasoning_parser, preset.tool_call_parser)
    assert choice.content and choice.finish_reason == "stop" and not choice.tool_calls
    assert (choice.reasoning is not None) is (preset.reasoning_parser is not None)
    assert choice.reasoning_tokens == (0 if choice.reasoning is None else pytest.approx(800, rel=0.05))
    for marker in ("<think>", "</think>", "<|channel|>", "<|end|>", "<|message|>"):
        assert marker not in choice.content


def _copy_without_metadata(family: str, tmp_path: Path) -> Path:
    directory = tmp_path / family
    shutil.copytree(ensure_standin_tokenizer(family=family), directory)
    (directory / "datagen_standin.json").unlink()
    return directory


@pytest.mark.parametrize(
    ("family", "detected"),
    [("kimi-k2", "kimi-k2"), ("qwen3-thinking-2507", "qwen3"), ("deepseek-r1", "deepseek-r1"),
     ("glm-4.5", "glm-4.5"), ("gpt-oss", "gpt-oss")],
)  # fmt: skip
def test_family_detected_from_the_vocabulary(family: str, detected: str, tmp_path: Path) -> None:
    vocab = load_vocab(_copy_without_metadata(family, tmp_path))
    assert vocab.family.name == detected
    assert load_vocab(_copy_without_metadata(family, tmp_path / "named"), family=family).family.name == family


def test_a_family_whose_tokens_the_vocabulary_lacks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VocabError, match="gpt-oss"):
        load_vocab(ensure_standin_tokenizer(family="qwen3"), family="gpt-oss")


def test_directory_without_tokenizer_json_loads_through_transformers() -> None:
    """The real Kimi directory's shape (tiktoken.model + remote-code tokenizer class, no tokenizer.json) gets the
    same tables, through transformers with trust_remote_code, as the tokenizer.json stand-in it mirrors."""
    kimi_tiktoken = pytest.importorskip("datagen_operator.tokenizer.kimi_tiktoken")
    remote_dir = kimi_tiktoken.ensure_kimi_tiktoken_standin()
    assert not (remote_dir / "tokenizer.json").exists()
    remote, fast = load_vocab(remote_dir), load_vocab(ensure_standin_tokenizer())
    assert remote.family.name == fast.family.name == "kimi-k2"
    assert remote.token_bytes == fast.token_bytes and remote.text_bytes == fast.text_bytes
    assert remote.eos_ids == fast.eos_ids and remote.runs.prefill_tails == fast.runs.prefill_tails
    text = "Hello <think> world</think><|im_end|>"
    assert remote.encode(text) == fast.encode(text)


def _server_flags(preset: Preset) -> list[str]:
    flags = ["--sim-mean-reasoning-tokens", "40", "--sim-mean-answer-tokens", "20", "--sim-length-sigma", "0"]
    for flag, value in (
        ("--reasoning-parser", preset.reasoning_parser),
        ("--tool-call-parser", preset.tool_call_parser),
    ):
        flags += [flag, value] if value else []
    return flags


def test_every_preset_over_http() -> None:
    """/generate answers in the family's raw tokens; the chat endpoint splits them with the preset's parsers."""
    chosen = sorted(presets().values(), key=lambda preset: preset.name)
    flag_sets = [
        [*_server_flags(preset), "--model-path", str(ensure_standin_tokenizer(family=preset.family))]
        for preset in chosen
    ]
    with start_sims(flag_sets) as servers:
        for preset, server in zip(chosen, servers, strict=True):
            vocab = vocab_for(preset)
            prompt = vocab.encode(render_chat(vocab.chat_template or "", [{"role": "user", "content": "Hi"}]))
            reply = post(
                server.url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 500}}
            ).json()
            assert reply["output_ids"][-1] in stop_ids(preset), preset.name
            assert reply["meta_info"]["finish_reason"] == {"type": "stop", "matched": reply["output_ids"][-1]}
            body = {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, "max_tokens": 500}
            message = post(server.url, "/v1/chat/completions", body).json()["choices"][0]["message"]
            assert (message["reasoning_content"] is not None) is preset.thinking.supported, preset.name
            assert message["content"] or message["tool_calls"], preset.name
