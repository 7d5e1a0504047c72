"""OpenAI content parts, held to SGLang 0.5.23's own chat path: the template's content format detected as SGLang
detects it, and every message handed to the template as serving_chat hands it (text parts joined with one space
for a string-format template, kept as text parts for an "openai" one, a tool message's joined either way)."""

from __future__ import annotations

from importlib import resources
from typing import Any

import pytest

from datagen_operator.engine.chat_content import content_format, content_problem, template_messages
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

FAMILY_TEMPLATES = sorted(
    path.name for path in resources.files("datagen_operator.tokenizer").iterdir() if path.name.endswith(".jinja")
)
SYNTHETIC_TEMPLATES = {
    "loops-msg": "{% for msg in messages %}{% for part in msg.content %}{{ part.text }}{% endfor %}{% endfor %}",
    "loops-filtered": "{% for message in messages %}{% for p in message['content'] | list %}{{ p }}{% endfor %}"
    "{% endfor %}",
    "loops-sliced": "{% for m in messages %}{% for p in m.content[1:] %}{{ p }}{% endfor %}{% endfor %}",
    "loops-messages-only": "{% for message in messages %}{{ message.content }}{% endfor %}",
    "mentions-vision": "{# vision #}{% for message in messages %}{{ message.content }}{% endfor %}",
    "unparsable": "{% for message in messages %}{{ message.content }",
    "generation-tag": "{% for message in messages %}{% generation %}{% for p in message.content %}{{ p.text }}"
    "{% endfor %}{% endgeneration %}{% endfor %}",
}


def _template(name: str) -> str:
    if name in SYNTHETIC_TEMPLATES:
        return SYNTHETIC_TEMPLATES[name]
    return resources.files("datagen_operator.tokenizer").joinpath(name).read_text(encoding="utf-8")


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " rain.\n"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "It falls."}]},
    {"role": "user", "content": []},
    {"role": "user", "content": ""},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]},
    {"role": "developer", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "y"}]},
    {"role": "user", "content": "plain"},
]


@pytest.mark.parametrize("name", [*FAMILY_TEMPLATES, *SYNTHETIC_TEMPLATES])
def test_text_parts_reach_the_template_as_sglangs_chat_endpoint_hands_them(sglang: SGLang, name: str) -> None:
    template = _template(name)
    theirs = sglang.call(sglang_side.template_content, MESSAGES, template)
    assert content_format(template) == theirs["format"]
    assert all(content_problem(message, "m") is None for message in MESSAGES)
    assert template_messages(MESSAGES, content_format(template)) == theirs["messages"]


def test_both_formats_are_among_the_families_templates() -> None:
    # Not vacuous: the family templates hold string-format and "openai"-format ones (GLM-4.5, Kimi-K2.5).
    assert {content_format(_template(name)) for name in FAMILY_TEMPLATES} == {"string", "openai"}


REFUSED: list[dict[str, Any]] = [
    {"role": "user"},  # a user message must have content
    {"role": "user", "content": None},
    {"role": "user", "content": [{"type": "text", "value": "LLaMA-Factory's part"}]},
    {"role": "user", "content": [{"type": "text"}]},
    {"role": "user", "content": ["a string part"]},
    {"role": "user", "content": 5},
    {"role": "system", "content": {"text": "an object"}},
]


@pytest.mark.parametrize("message", REFUSED, ids=range(len(REFUSED)))
def test_content_set_aside_as_bad_messages_is_content_sglang_refuses(sglang: SGLang, message: dict[str, Any]) -> None:
    problem = content_problem(message, "message 1")
    assert problem is not None and problem[0] is False  # bad_messages, not a part that is not text
    assert "refused" in sglang.call(sglang_side.template_content, [message], _template("qwen3_chat_template.jinja"))
