"""Stand-in tokenizers per model family: published ids and `special` flags, offline loading, template shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from datagen_operator.presets import presets
from datagen_operator.tokenizer.families import FAMILIES, Family
from datagen_operator.tokenizer.standin import ensure_standin, ensure_standin_tokenizer, main
from tests.kimi_reference import TOOLS

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
# Published ids (families.py names each source), checked here against the built stand-ins.
PUBLISHED = {
    "qwen3": [("<|endoftext|>", 151643, True), ("<|im_start|>", 151644, True), ("<|im_end|>", 151645, True),
              ("<tool_call>", 151657, False), ("</tool_call>", 151658, False), ("<think>", 151667, False),
              ("</think>", 151668, False)],
    "deepseek-r1": [("<｜begin▁of▁sentence｜>", 0, True), ("<｜end▁of▁sentence｜>", 1, True), ("<think>", 128798, False),
                    ("</think>", 128799, False), ("<｜User｜>", 128803, False), ("<｜Assistant｜>", 128804, False),
                    ("<｜tool▁calls▁begin｜>", 128806, False), ("<｜tool▁calls▁end｜>", 128807, False),
                    ("<｜tool▁call▁begin｜>", 128808, False), ("<｜tool▁call▁end｜>", 128809, False),
                    ("<｜tool▁sep｜>", 128814, False)],
    "glm-4.5": [("<|endoftext|>", 151329, True), ("<|user|>", 151336, True), ("<|observation|>", 151338, True),
                ("<think>", 151350, False), ("</think>", 151351, False)],
    "gpt-oss": [("<|startoftext|>", 199998, True), ("<|endoftext|>", 199999, True), ("<|return|>", 200002, True),
                ("<|constrain|>", 200003, True), ("<|channel|>", 200005, True), ("<|start|>", 200006, True),
                ("<|end|>", 200007, True), ("<|message|>", 200008, True), ("<|call|>", 200012, True)],
    "kimi-k2": [("<|im_end|>", 163586, True), ("<think>", 163606, False), ("</think>", 163607, False)],
}  # fmt: skip
# What each stand-in's generation prompt ends with: thinking by default, and with the family's switch off.
TAILS: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "kimi-k2": ("<|im_middle|><think>", "<|im_middle|><think></think>", {"thinking": False}),
    "kimi-k2-thinking": ("assistant<|im_middle|>", None, {}),
    "kimi-k2-instruct": ("assistant<|im_middle|>", None, {}),
    "qwen3": ("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n", {"enable_thinking": False}),
    "qwen3-thinking-2507": ("<|im_start|>assistant\n<think>\n", None, {}),
    "deepseek-r1": ("<｜Assistant｜><think>\n", None, {}),
    "glm-4.5": ("<|assistant|>", "<|assistant|>\n<think></think>", {"enable_thinking": False}),
    "gpt-oss": ("<|end|><|start|>assistant", None, {}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def hf(family: Family) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_standin_tokenizer(family=family.name)), local_files_only=True)


def test_every_added_token_at_its_id_with_its_flag(family: Family, hf: Any) -> None:
    assert len(hf) == family.tokenizer_size
    decoder = hf.added_tokens_decoder
    for token in family.added_tokens():
        assert hf.encode(token.content, add_special_tokens=False) == [token.id], token
        assert (decoder[token.id].content, decoder[token.id].special) == (token.content, token.special)


def test_published_ids(family: Family) -> None:
    named = {token.content: (token.id, token.special) for token in family.named}
    for content, token_id, special in PUBLISHED.get(family.name, []):
        assert named[content] == (token_id, special), content


def test_special_flag_decides_what_skip_special_tokens_drops(family: Family, hf: Any) -> None:
    ids = [*hf.encode("hello", add_special_tokens=False), *(token.id for token in family.named)]
    kept = hf.decode(ids, skip_special_tokens=True)
    for token in family.named:
        assert (token.content in kept) is (not token.special), token


def test_text_round_trips_through_the_byte_level_bpe(hf: Any) -> None:
    text = "Unicode: 你好, ελληνικά, emoji 🚀 and code `x += 1`\n"
    assert hf.decode(hf.encode(text, add_special_tokens=False)) == text


def test_template_renders_the_thinking_shapes(family: Family, hf: Any) -> None:
    default_tail, off_tail, off_switch = TAILS[family.name]
    rendered = hf.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith(default_tail), rendered[-80:]
    if off_tail is not None:
        off = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True, **off_switch)
        assert off.endswith(off_tail), off[-80:]
    # The family's own description of its tails agrees with what the template renders.
    prefill = family.chat.prefill_tails
    assert any(rendered.endswith(tail) for tail in prefill) if prefill else True
    assert "get_weather" in rendered


def test_qwen3_2507_prompt_ends_with_the_opener_then_a_newline_token() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_standin_tokenizer(family="qwen3-thinking-2507")))
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[-2] == 151667 and tokenizer.decode(ids[-1:]) == "\n"


@pytest.mark.parametrize(
    ("family_name", "eos"),
    [("qwen3", [151645, 151643]), ("glm-4.5", [151329, 151336, 151338]), ("gpt-oss", [200002, 199999, 200012])],
)
def test_generation_config_lists_the_stop_ids(family_name: str, eos: list[int]) -> None:
    directory = ensure_standin_tokenizer(family=family_name)
    assert json.loads((directory / "generation_config.json").read_text())["eos_token_id"] == eos


@pytest.mark.parametrize("preset_name", sorted(presets()))
def test_preset_ids_are_the_stand_ins(preset_name: str) -> None:
    """A preset's given ids are its stand-in's; a null id is one the tokenizer resolves to a single token."""
    preset = presets()[preset_name]
    family = FAMILIES[preset.family]
    ids = {token.content: token.id for token in family.added_tokens()}
    refs = [
        preset.think_start,
        preset.think_end,
        *preset.stop_tokens,
        *(t for pair in preset.tool_call_markers for t in pair),
    ]
    for ref in filter(None, refs):
        if ref.id is not None:
            assert ids[ref.text] == ref.id, ref
        elif family.chat.reasoning != "harmony" or ref is not preset.think_start:
            assert ref.text in ids, ref


def test_ensure_standin_per_preset_and_into_a_folder(tmp_path: Path) -> None:
    cached = ensure_standin("qwen3-thinking-2507")
    assert json.loads((cached / "datagen_standin.json").read_text())["family"] == "qwen3-thinking-2507"
    assert ensure_standin("kimi-k2.5") == ensure_standin_tokenizer()
    out = ensure_standin("glm-4.5", tmp_path / "glm")
    stamp = (out / "tokenizer.json").stat().st_mtime_ns
    assert ensure_standin("glm-4.5", out) == out and (out / "tokenizer.json").stat().st_mtime_ns == stamp
    with pytest.raises(KeyError, match="unknown preset"):
        ensure_standin("no-such-model")


def test_cli_builds_a_presets_standin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--preset", "gpt-oss", "--out", str(tmp_path / "oss")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "oss")
    assert json.loads((tmp_path / "oss" / "config.json").read_text())["model_type"] == "gpt_oss"
    with pytest.raises(SystemExit):
        main(["--preset", "no-such-model"])
