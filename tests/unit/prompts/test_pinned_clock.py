"""prompts.render.pinned_template: a template's `strftime_now` answers for the output's render date."""

from __future__ import annotations

from datagen_operator.prompts.render import pinned_template
from datagen_operator.tokenizer.chat_template import render_chat

LLAMA_STYLE = (
    "{{- 'Today Date: ' + strftime_now('%d %b %Y') + '\\n' }}{{- 'Current date: ' + strftime_now(\"%Y-%m-%d\") }}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)


def test_every_format_the_template_asks_for_answers_for_the_pinned_day() -> None:
    pinned = pinned_template(LLAMA_STYLE, "2020-01-02")
    assert (
        render_chat(pinned, [{"role": "user", "content": "hi"}])
        == "Today Date: 02 Jan 2020\nCurrent date: 2020-01-02hi"
    )


def test_a_template_without_a_clock_or_without_a_date_is_left_as_it_is() -> None:
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert pinned_template(plain, "2020-01-02") == plain
    assert pinned_template(LLAMA_STYLE, None) == LLAMA_STYLE
