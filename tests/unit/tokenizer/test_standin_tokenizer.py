"""The Kimi-K2-format stand-in tokenizer: ids, flags, byte-level round trips, chat template, caching."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.presets import get_preset
from datagen_operator.tokenizer import kimi_tokens
from datagen_operator.tokenizer.chat_template import kimi_k2_chat_template, render_chat
from datagen_operator.tokenizer.standin import (
    CACHE_ENV,
    FILES,
    default_cache_root,
    ensure_standin_tokenizer,
    main,
    standin_dir_name,
)
from tests.kimi_reference import REFERENCE_TABLE, TOOLS

TOOLS_JSON = (
    '[{"type":"function","function":{"name":"get_weather","description":"Weather for a city","parameters":'
    '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
)


@pytest.fixture(scope="module")
def hf(standin_tokenizer: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(standin_tokenizer), local_files_only=True)


# -- vocabulary ---------------------------------------------------------------------------------


def test_directory_has_the_files_transformers_and_sglang_read(standin_tokenizer: Path) -> None:
    assert sorted(path.name for path in standin_tokenizer.iterdir()) == sorted(FILES)


def test_vocabulary_size_and_eos(hf: Any) -> None:
    assert len(hf) == kimi_tokens.VOCAB_SIZE == 163_840
    assert hf.eos_token == "[EOS]" and hf.eos_token_id == 163585
    assert hf.bos_token_id == 163584 and hf.pad_token_id == 163839 and hf.unk_token_id == 163838


@pytest.mark.parametrize(("content", "token_id", "special"), REFERENCE_TABLE)
def test_every_kimi_token_has_its_real_id_and_flag(hf: Any, content: str, token_id: int, special: bool) -> None:
    assert hf.convert_tokens_to_ids(content) == token_id
    assert hf.convert_ids_to_tokens(token_id) == content
    assert hf.added_tokens_decoder[token_id].special is special
    assert hf(content, add_special_tokens=False).input_ids == [token_id]


def test_the_code_table_matches_the_reference_and_the_presets() -> None:
    assert [(t.content, t.id, t.special) for t in kimi_tokens.NAMED_TOKENS] == REFERENCE_TABLE
    preset = get_preset("kimi-k2.5")
    assert (preset.think_start.id, preset.think_end.id) == (kimi_tokens.THINK.id, kimi_tokens.THINK_END.id)
    assert [stop.id for stop in preset.stop_tokens] == [kimi_tokens.IM_END.id]
    markers = {(begin.id, end.id) for begin, end in preset.tool_call_markers}
    assert markers == {(163595, 163596), (163597, 163599)}


def test_the_rest_of_the_special_range_is_reserved_and_special(hf: Any) -> None:
    named = {token_id for _, token_id, _ in REFERENCE_TABLE}
    reserved = [token_id for token_id in range(163584, 163840) if token_id not in named]
    assert len(reserved) == 256 - len(named)
    for token_id in reserved:
        assert hf.convert_ids_to_tokens(token_id) == f"<|reserved_token_{token_id}|>"
        assert hf.added_tokens_decoder[token_id].special is True


def test_skip_special_tokens_drops_im_end_but_keeps_think_and_tool_tokens(hf: Any) -> None:
    ids = [163606, 163607, 163595, 163597, 163598, 163599, 163596, 163586, 163601, 163700]
    assert hf.decode(ids, skip_special_tokens=True) == (
        "<think></think><|tool_calls_section_begin|><|tool_call_begin|><|tool_call_argument_begin|>"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert hf.decode(ids, skip_special_tokens=False).endswith("<|im_end|><|im_middle|><|reserved_token_163700|>")


SAMPLES = [
    "Hello, world!", "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\n", "数据推理答案：模型思考步骤。",
    "日本語のテキストとカタカナ", "emoji 🙂🚀👍🏽 and ZWJ 👩‍💻", "Ünïcödé ñ ß ø", "Здравствуй, мир", "مرحبا بالعالم",
    "math: ∑ x² ≤ ∞", "\x00\x01 control \x7f", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 astral", "",
]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    ranges = [(0x20, 0x7E), (0xA0, 0x2FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x0, 0x1F), (0x10000, 0x10FFFF)]
    chars = []
    for _ in range(rng.randint(0, 60)):
        low, high = rng.choice(ranges)
        code = rng.randint(low, high)
        chars.append(chr(code) if not 0xD800 <= code <= 0xDFFF else "x")
    return "".join(chars)


def test_any_utf8_text_round_trips_with_regular_ids_only(hf: Any) -> None:
    rng = random.Random(4)
    for text in [*SAMPLES, *(_random_text(rng) for _ in range(200))]:
        ids = hf(text, add_special_tokens=False).input_ids
        assert all(token_id < kimi_tokens.FIRST_SPECIAL_ID for token_id in ids), text
        assert hf.decode(ids) == text


def test_no_bos_is_added(hf: Any) -> None:
    assert 163584 not in hf("hi").input_ids


# -- chat template ------------------------------------------------------------------------------


def test_single_turn_thinking_on_by_default(hf: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    words = {word: hf(word, add_special_tokens=False).input_ids for word in ("user", "Hi", "assistant")}
    assert ids == [163587, *words["user"], 163601, *words["Hi"], 163586, 163588, *words["assistant"], 163601, 163606]


def test_thinking_off_ends_with_an_empty_think_block(hf: Any) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, thinking=False)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    ids = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, thinking=False, tokenize=True)
    assert ids["input_ids"][-3:] == [163601, 163606, 163607]


def test_system_and_multi_turn_history_drop_reasoning(hf: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "Q2", "name": "alice"},
    ]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Q1<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
        "<|im_user|>alice<|im_middle|>Q2<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_tool_declarations_calls_and_results(hf: Any) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "I need the tool.",
            "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "call_x", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "20C"},
    ]  # fmt: skip
    text = hf.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == (
        f"<|im_system|>tool_declare<|im_middle|>{TOOLS_JSON}<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>I need the tool.</think>Let me check."
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Lyon"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n18C<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n20C<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    ids = hf.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)["input_ids"]
    for structural in (163594, 163595, 163597, 163598, 163599, 163596):
        assert structural in ids


def test_simulator_renderer_matches_transformers(hf: Any) -> None:
    conversations = [
        ([{"role": "user", "content": "Hi"}], None, {}),
        ([{"role": "user", "content": "Hi"}], TOOLS, {"thinking": False}),
        ([{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}], None, {}),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "r"},
          {"role": "user", "content": "c"}], None, {"thinking": True}),
    ]  # fmt: skip
    for messages, tools, variables in conversations:
        expected = hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **variables
        )
        assert render_chat(kimi_k2_chat_template(), messages, tools=tools, **variables) == expected


def test_simulator_renderer_drops_null_fields_as_transformers_does(hf: Any) -> None:
    """An API's `content: null` beside tool calls: transformers drops the key, so a template that prints it
    unguarded prints nothing, not "None"."""
    template = "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": []}]
    expected = hf.apply_chat_template(messages, chat_template=template, tokenize=False)
    assert expected == "user:Hi|assistant:|"
    assert render_chat(template, messages, add_generation_prompt=False) == expected


# -- building and caching -----------------------------------------------------------------------


def test_build_is_deterministic_and_cached_by_version(standin_tokenizer: Path, tmp_path: Path) -> None:
    fresh = ensure_standin_tokenizer(tmp_path)
    assert fresh == tmp_path / standin_dir_name() and fresh.name == standin_tokenizer.name
    assert fresh.name.startswith("kimi-k2-standin-v1-")
    for name in FILES:
        assert (fresh / name).read_bytes() == (standin_tokenizer / name).read_bytes(), name
    stamp = (fresh / "tokenizer.json").stat().st_mtime_ns
    assert ensure_standin_tokenizer(tmp_path) == fresh
    assert (fresh / "tokenizer.json").stat().st_mtime_ns == stamp, "the second call reuses the cache"
    assert [path.name for path in tmp_path.iterdir()] == [fresh.name], "no staging leftovers"


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv(CACHE_ENV)
    assert default_cache_root().parts[-2:] == ("datagen-operator", "tokenizer")


def test_cli_prints_the_directory(standin_tokenizer: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cache-dir", str(standin_tokenizer.parent)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(standin_tokenizer)
