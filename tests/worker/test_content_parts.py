"""OpenAI content-part messages read and rendered as SGLang's chat endpoint reads and renders them
(engine/chat_content.py, held to SGLang's own functions by tests/contract/test_content_parts.py): text parts joined
in every role for a string-format template, kept as text parts for an "openai" one; a part that is not text set
aside, named."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.engine.chat_content import NON_TEXT_CONTENT, content_format
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.line_shape import BAD_MESSAGES
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.render import Renderer, load_tokenizer
from datagen_operator.tokenizer.standin import ensure_standin_tokenizer


def _parts(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text} for text in texts]


def _jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return path


def test_text_parts_in_every_role_are_read_and_other_parts_set_aside_naming_them(tmp_path: Path) -> None:
    lines = [
        {"id": "parts", "messages": [
            {"role": "system", "content": _parts("Be brief.")},
            {"role": "user", "content": _parts("Describe", "rain.")},
            {"role": "assistant", "content": _parts("Water.")},
            {"role": "tool", "content": _parts("r")},
        ]},
        {"id": "image", "messages": [
            {"role": "user", "content": [*_parts("What is this?"), {"type": "image_url", "image_url": {"url": "u"}}]},
        ]},
        {"id": "audio", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        {"id": "llama-factory", "messages": [{"role": "user", "content": [{"type": "text", "value": "Hi"}]}]},
        {"id": "no-content", "messages": [{"role": "user"}]},
    ]  # fmt: skip
    plan = plan_shard(DatasetRef(_jsonl(tmp_path / "d.jsonl", lines)), 0, 1)
    assert [ref.id for ref in plan.prompts] == ["parts"]
    aside = {line.id: (line.cause, line.reason) for line in plan.malformed}
    assert aside["image"][0] == aside["audio"][0] == NON_TEXT_CONTENT
    assert aside["image"][1].startswith("message 1 (messages[0]) content[1] is a 'image_url' part: only text parts")
    assert aside["audio"][1].startswith("message 1 (messages[0]) content[0] is a 'input_audio' part")
    assert aside["llama-factory"] == (
        BAD_MESSAGES,
        'message 1 (messages[0]) content[0] is a text part without a string "text" (LLaMA-Factory\'s `value` is not '
        'OpenAI\'s `text`): SGLang\'s chat endpoint reads {"type": "text", "text": "..."}',
    )
    assert aside["no-content"] == (
        BAD_MESSAGES,
        "message 1 (messages[0]) is a user message without content (SGLang's chat endpoint requires it)",
    )


@cache
def _renderer(family: str) -> Renderer:
    tokenizer = load_tokenizer(ensure_standin_tokenizer(family=family), trust_remote_code=False)
    return Renderer(tokenizer, {"enable_thinking": True, "thinking": True})


@pytest.mark.parametrize("family", ["qwen3", "deepseek-r1", "gpt-oss", "kimi-k2"])
def test_a_string_format_template_gets_the_text_parts_joined_in_every_role(family: str) -> None:
    # It used to get the list: an empty user turn for Qwen3, a template failure in a system message.
    renderer = _renderer(family)
    assert content_format(renderer.chat_template) == "string"
    with_parts = [
        {"role": "system", "content": _parts("Be", "brief.")},
        {"role": "user", "content": _parts("Describe", "rain.")},
    ]
    joined = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Describe rain."}]
    expected = renderer.reference(joined, None)
    assert renderer.reference(with_parts, None) == expected
    assert renderer.lean is not None and renderer.lean.render(with_parts, None) == expected
    assert "Describe rain." in renderer.tokenizer.decode(expected)


@pytest.mark.parametrize("family", ["glm-4.5", "kimi-k2-thinking"])
def test_an_openai_format_template_gets_the_text_parts_as_parts(family: str) -> None:
    renderer = _renderer(family)
    assert content_format(renderer.chat_template) == "openai"
    with_parts = [{"role": "user", "content": [*_parts("Describe"), {"type": "text", "text": "rain.", "extra": 1}]}]
    as_parts = [{"role": "user", "content": _parts("Describe", "rain.")}]
    ids = renderer.reference(with_parts, None)
    assert ids == renderer.reference(as_parts, None)
    assert renderer.lean is None or renderer.lean.render(with_parts, None) == ids
    assert "Describe" in renderer.tokenizer.decode(ids) and "rain." in renderer.tokenizer.decode(ids)
