"""The Kimi-K2.5 stand-in shaped like the real directory: tiktoken.model + remote code, no tokenizer.json.

Its ids must equal the tokenizer.json stand-in's (records made with either decode the same), and it must
load and behave through transformers' `trust_remote_code` path as the real Kimi tokenizer does.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from datagen_operator import cli
from datagen_operator.output.fingerprint import tokenizer_files, tokenizer_fingerprint
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.tokenizer import kimi_tiktoken, kimi_tokens, standin
from datagen_operator.tokenizer.chat_template import kimi_k2_chat_template, render_chat
from datagen_operator.tokenizer.corpus import training_lines
from tests.kimi_reference import REFERENCE_TABLE, TOOLS

REPO = Path(__file__).resolve().parents[3]
# The tokenizer files of moonshotai/Kimi-K2.5 (and K2-Thinking, K2.6): no tokenizer.json, no special_tokens_map.
REAL_KIMI_TOKENIZER_FILES = ["chat_template.jinja", "tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json"]
TOOL_CALL_MARKUP = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "東京"}<|tool_call_end|><|tool_calls_section_end|>'
)
TEXTS = [
    "",
    "Hello, world! It's a test: don't we'll they've I'm you'd.",
    "  leading spaces\tand\ttabs\r\nand CRLF\n\n\n   trailing   ",
    "数字 12345678901234567890 and 3.14159, 1e-9",
    "中文：你好，世界！日本語：こんにちは。한국어: 안녕하세요.",
    "emoji 🙂👍🏽👨‍👩‍👧‍👦🏳️‍🌈 flags 🇯🇵🇫🇷 and ZWJ",
    "Ünïcödé çombining: e\u0301 a\u0308 \u200b\u2028\u00a0nbsp",
    "code: def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "<think>reasoning here</think>The answer.<|im_end|>",
    "[BOS][EOS][UNK][PAD][EOT]<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>",
    "<|reserved_token_163589|> <|reserved_token_163700|>x",
    "half tokens: <think <|im_end| [BOS </think",
    TOOL_CALL_MARKUP,
    "filler163583 filler6100 filler",
]
# Conversations the worker renders: system, tools, history with reasoning, tool calls and results.
CHATS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "What is 2+2?"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "天気は？ 🙂"}], TOOLS),
    (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "call the tool",
                "tool_calls": [
                    {
                        "id": "functions.get_weather:0",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18°C, sunny"},
        ],
        TOOLS,
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]}],
        None,
    ),
]


@pytest.fixture(scope="module")
def kimi_dir() -> Path:
    return kimi_tiktoken.ensure_kimi_tiktoken_standin()


@pytest.fixture(scope="module")
def kimi(kimi_dir: Path) -> Any:
    return load_tokenizer(kimi_dir, trust_remote_code=True)


@pytest.fixture(scope="module")
def fast() -> Any:
    return load_tokenizer(standin.ensure_standin_tokenizer(), trust_remote_code=False)


def _random_text(rng: random.Random, length: int) -> str:
    pools = [(0x20, 0x7E), (0xA0, 0x7FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF)]
    chars = []
    for _ in range(length):
        if rng.random() < 0.1:
            chars.append(rng.choice(" \n\t'"))
            continue
        low, high = rng.choice(pools) if rng.random() < 0.9 else (0, 0x10FFFF)
        code = rng.randint(low, high)
        chars.append(chr(code) if not 0xD800 <= code <= 0xDFFF else "x")
    return "".join(chars)


def corpus() -> list[str]:
    rng = random.Random(12)
    return [*TEXTS, *training_lines(count=300), *(_random_text(rng, rng.randint(1, 60)) for _ in range(400))]


# --- loading -----------------------------------------------------------------------------------------


def test_loads_the_remote_code_class_offline_in_a_fresh_process(kimi_dir: Path, fast: Any, tmp_path: Path) -> None:
    """The real path: HF_HUB_OFFLINE, an empty dynamic-module cache, only the directory's own files."""
    script = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "print(json.dumps([type(t).__name__, type(t).__module__, t.is_fast, t.encode(sys.argv[2])]))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", script, str(kimi_dir), TOOL_CALL_MARKUP],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    name, module, is_fast, ids = json.loads(result.stdout.strip().splitlines()[-1])
    assert (name, is_fast) == ("TikTokenTokenizer", False)
    assert module.startswith("transformers_modules.") and module.endswith(".tokenization_kimi")
    assert ids == fast.encode(TOOL_CALL_MARKUP)


def test_without_trust_remote_code_it_does_not_load(kimi_dir: Path) -> None:
    """No tokenizer.json to fall back on: the spec's trustRemoteCode is what makes it load."""
    with pytest.raises(ValueError, match=r"trust_remote_code"):
        load_tokenizer(kimi_dir, trust_remote_code=False)


def test_backed_by_tiktoken(kimi: Any) -> None:
    import tiktoken

    assert isinstance(kimi.model, tiktoken.Encoding)
    assert kimi.model.n_vocab == kimi_tokens.VOCAB_SIZE


# --- same ids as the tokenizer.json stand-in ---------------------------------------------------------


def test_same_ids_as_the_tokenizer_json_standin(kimi: Any, fast: Any) -> None:
    for text in corpus():
        expected = fast.encode(text, add_special_tokens=False)
        assert kimi.encode(text) == expected, text  # tiktoken directly
        assert kimi.encode(text, add_special_tokens=False) == expected, text  # transformers' slow path
        assert kimi(text)["input_ids"] == fast(text)["input_ids"], text


def test_every_trained_token_encodes_to_itself(kimi: Any, fast: Any) -> None:
    """Each vocabulary entry's own text: where tiktoken's rank order and BPE's merge order could differ."""
    vocab = fast.get_vocab()
    texts = [fast.decode([i]) for i in sorted(vocab.values()) if i < 8000]
    for text in texts:
        if "\ufffd" not in text:
            assert kimi.encode(text) == fast.encode(text, add_special_tokens=False), text


def test_allow_special_tokens_false_encodes_markup_as_text(kimi: Any) -> None:
    ids = kimi.encode("<think>", allow_special_tokens=False)
    assert kimi_tokens.THINK.id not in ids and kimi.decode(ids) == "<think>"


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_renders_match_the_standin_and_the_kimi_format(kimi: Any, fast: Any, thinking: bool) -> None:
    for messages, tools in CHATS:
        ids = kimi.apply_chat_template(messages, tools=tools, tokenize=True, thinking=thinking, return_dict=False)
        assert ids == fast.apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, thinking=thinking, return_dict=False
        )
        text = kimi.apply_chat_template(messages, tools=tools, tokenize=False, thinking=thinking)
        assert text == render_chat(kimi_k2_chat_template(), messages, tools=tools, thinking=thinking)
        if thinking:
            assert ids[-1] == kimi_tokens.THINK.id and text.endswith("<|im_middle|><think>")
        else:
            assert ids[-2:] == [kimi_tokens.THINK.id, kimi_tokens.THINK_END.id]
            assert text.endswith("<|im_middle|><think></think>")


def test_apply_chat_template_defaults_are_the_real_classes(kimi: Any) -> None:
    """Real Kimi: text unless tokenize=True, a generation prompt, thinking on."""
    text = kimi.apply_chat_template([{"role": "user", "content": "hi"}])
    assert isinstance(text, str) and text.endswith("<|im_assistant|>assistant<|im_middle|><think>")


# --- special tokens, decoding ------------------------------------------------------------------------


def test_special_tokens_at_their_ids_with_their_flags(kimi: Any, kimi_dir: Path) -> None:
    for content, token_id, special in REFERENCE_TABLE:
        assert kimi.convert_tokens_to_ids(content) == token_id
        assert kimi.convert_ids_to_tokens(token_id) == content
        assert kimi.encode(content) == [token_id]
        assert kimi.decode([token_id]) == content
        assert kimi.decode([token_id], skip_special_tokens=True) == ("" if special else content), content
        assert kimi.added_tokens_decoder[token_id].special is special
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    assert sorted(map(int, decoder)) == list(range(kimi_tokens.FIRST_SPECIAL_ID, kimi_tokens.VOCAB_SIZE))
    assert decoder["163700"] == {
        "content": "<|reserved_token_163700|>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True,
    }  # fmt: skip
    assert (kimi.bos_token, kimi.eos_token, kimi.unk_token, kimi.pad_token) == ("[BOS]", "[EOS]", "[UNK]", "[PAD]")
    assert kimi.eos_token_id == kimi_tokens.EOS.id


def test_decode_matches_the_standin_for_every_special_id_and_mixture(kimi: Any, fast: Any) -> None:
    special_ids = list(range(kimi_tokens.FIRST_SPECIAL_ID, kimi_tokens.VOCAB_SIZE))
    rng = random.Random(3)
    mixtures = [[*fast.encode("a b"), i, *fast.encode(" 你好")] for i in special_ids]
    mixtures += [rng.sample(range(kimi_tokens.VOCAB_SIZE), 40) for _ in range(50)]  # invalid UTF-8 included
    for ids in [[i] for i in special_ids] + mixtures:
        for skip in (False, True):
            assert kimi.decode(ids, skip_special_tokens=skip) == fast.decode(ids, skip_special_tokens=skip), ids


def test_any_utf8_text_round_trips(kimi: Any) -> None:
    for text in corpus():
        assert kimi.decode(kimi.encode(text)) == text, text
        assert kimi.decode(kimi.encode(text, allow_special_tokens=False)) == text, text


# --- the transformers slow-tokenizer API -------------------------------------------------------------


def test_vocab_api(kimi: Any, fast: Any) -> None:
    assert kimi.vocab_size == len(kimi) == kimi_tokens.VOCAB_SIZE  # as the real class: ranks + 256 specials
    assert kimi.get_vocab() == fast.get_vocab()
    rng = random.Random(5)
    ids = [*rng.sample(range(kimi_tokens.VOCAB_SIZE), 2000), 0, 255, kimi_tokens.FIRST_SPECIAL_ID - 1]
    tokens = kimi.convert_ids_to_tokens(ids)
    assert tokens == fast.convert_ids_to_tokens(ids)
    assert kimi.convert_tokens_to_ids(tokens) == ids
    assert kimi.convert_tokens_to_string(kimi.tokenize("naïve 東京 🙂")) == "naïve 東京 🙂"
    assert kimi.tokenize("a<think>b") == ["a", "<think>", "b"]


def test_save_pretrained_round_trip(kimi: Any, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    kimi.save_pretrained(saved)
    assert {"tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"} <= {
        p.name for p in saved.iterdir()
    }
    assert not (saved / "tokenizer.json").exists()
    again = load_tokenizer(saved, trust_remote_code=True)
    assert type(again).__name__ == "TikTokenTokenizer"
    for text in TEXTS:
        assert again.encode(text) == kimi.encode(text)
    messages, tools = CHATS[2]
    assert again.apply_chat_template(messages, tools=tools, tokenize=True) == kimi.apply_chat_template(
        messages, tools=tools, tokenize=True
    )
    assert again.decode([163586, 163606], skip_special_tokens=True) == "<think>"


# --- the directory -------------------------------------------------------------------------------------


def test_directory_has_the_real_kimi_layout(kimi_dir: Path) -> None:
    assert [path.name for path in tokenizer_files(kimi_dir)] == REAL_KIMI_TOKENIZER_FILES
    assert not (kimi_dir / "tokenizer.json").exists()
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    assert config["auto_map"] == {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    assert config["tokenizer_class"] == "TikTokenTokenizer"
    assert json.loads((kimi_dir / "generation_config.json").read_text())["eos_token_id"] == kimi_tokens.IM_END.id
    assert json.loads((kimi_dir / "config.json").read_text())["vocab_size"] == kimi_tokens.VOCAB_SIZE
    json_standin = standin.ensure_standin_tokenizer()
    for name in ("chat_template.jinja", "config.json", "generation_config.json"):
        assert (kimi_dir / name).read_bytes() == (json_standin / name).read_bytes(), name
    assert standin.standin_family(kimi_dir) == "kimi-k2"  # the simulator reads the family from it


def test_tiktoken_model_is_the_tiktoken_bpe_format_and_keeps_the_standin_bytes(
    kimi_dir: Path, fast: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiktoken.load import load_tiktoken_bpe

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken's loader, uncached: the format the real class reads
    ranks = load_tiktoken_bpe(str(kimi_dir / "tiktoken.model"))
    assert sorted(ranks.values()) == list(range(kimi_tokens.FIRST_SPECIAL_ID))
    lines = (kimi_dir / "tiktoken.model").read_bytes().splitlines()
    assert lines[7].split() == [base64.b64encode(bytes([ord("(")])), b"7"]
    by_id = {rank: token for token, rank in ranks.items()}
    byte_of = {char: byte for byte, char in kimi_tiktoken.byte_level_alphabet().items()}
    standin_tokens = fast.convert_ids_to_tokens(list(range(kimi_tokens.FIRST_SPECIAL_ID)))  # trained + fillers
    assert [bytes(byte_of[char] for char in token) for token in standin_tokens] == [
        by_id[token_id] for token_id in range(kimi_tokens.FIRST_SPECIAL_ID)
    ]


def test_fingerprint_hashes_tiktoken_model_and_the_remote_code(kimi_dir: Path, tmp_path: Path) -> None:
    files = tokenizer_fingerprint(kimi_dir)["files"]
    for name in ("tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"):
        assert files[name] == hashlib.sha256((kimi_dir / name).read_bytes()).hexdigest()
    changed = shutil.copytree(kimi_dir, tmp_path / "changed")
    with (changed / "tokenization_kimi.py").open("a") as handle:
        handle.write("\n# a changed tokenizer class\n")
    assert tokenizer_fingerprint(changed)["sha256"] != tokenizer_fingerprint(kimi_dir)["sha256"]


def test_remote_code_imports_only_what_the_worker_image_pins() -> None:
    source = kimi_tiktoken.tokenization_source().decode()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"__future__"}
    assert third_party == {"tiktoken", "transformers"}
    pins = {
        line.partition("==")[0]
        for line in (REPO / "images" / "requirements.txt").read_text().splitlines()
        if "==" in line
    }
    assert third_party <= pins
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(line.startswith("tiktoken") for line in dependencies)


# --- cache and CLI -------------------------------------------------------------------------------------


def test_cache_is_keyed_by_the_sources_and_the_standin(
    kimi_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kimi_dir.name == kimi_tiktoken.standin_dir_name()
    assert kimi_tiktoken.ensure_kimi_tiktoken_standin() == kimi_dir
    assert json.loads((kimi_dir / "datagen_standin.json").read_text())["source_hash"] == kimi_tiktoken.source_hash()
    before = kimi_tiktoken.source_hash()
    monkeypatch.setattr(standin, "source_hash", lambda: "another-vocabulary")
    assert kimi_tiktoken.source_hash() != before  # a new tokenizer.json stand-in builds a new directory


def test_cli_builds_with_the_flag_and_delegates_without(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "kimi"
    assert cli.main(["standin-tokenizer", "--kimi-tiktoken", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(kimi_tiktoken.FILES)
    seen: list[list[str]] = []
    monkeypatch.setattr(standin, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["standin-tokenizer", "--out", str(tmp_path / "json")]) == 0
    assert seen == [["--out", str(tmp_path / "json")]]
