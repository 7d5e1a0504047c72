"""Each stand-in's chat template renders what the model's published template renders.

The published templates come from llama-cpp-python's sdist (tests/real_templates.py: pinned, downloaded once,
never committed). Each family of `FAMILIES` is held to the closest one there:

| family | real template | why this one |
|---|---|---|
| kimi-k2-thinking | Kimi-K2-Thinking.jinja | Moonshot's K2-Thinking template |
| kimi-k2-instruct | Kimi-K2-Instruct.jinja | the current K2-Instruct template; moonshotai-Kimi-K2.jinja is the first release's (another default system prompt, arguments always JSON-encoded, a literal `\\n` after `## Return of`), since replaced |
| qwen3 | Qwen-Qwen3-0.6B.jinja | the Qwen3 hybrid (enable_thinking) template; the hybrid checkpoints share it |
| deepseek-r1 | deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja | DeepSeek's R1 template as published with the R1 distills; the -Qwen-32B copy carries llama.cpp's own edits (an `enable_thinking` test that closes `<think>` when the variable is unset, as under transformers, and JSON-encoded arguments). The sdist has no R1-0528 template: 0528's own may differ |
| glm-4.5 | GLM-4.6.jinja | the sdist has no GLM-4.5 copy (its README lists one); 4.6 writes 4.5's format (GLM-4.7-Flash's is another: no newlines, `</think>` alone for history) |
| gpt-oss | openai-gpt-oss-120b.jinja | the gpt-oss template (20b's is the same) |

No counterpart in the sdist, so not compared with a real template: kimi-k2 (Kimi-K2.5/K2.6; Kimi-K3.jinja is a
different format; its template follows moonshotai/Kimi-K2.5's, tokenizer/families.py [kimi-format]) and
qwen3-thinking-2507 (held instead to the qwen3 stand-in plus its generation prompt:
test_qwen3_2507_is_the_hybrid_template_opening_think).

Both sides render through transformers' `apply_chat_template(tokenize=False, add_generation_prompt=True)` of
the family's stand-in tokenizer (the real template passed as `chat_template=`), over the same conversations:
plain, no system prompt, earlier assistant turns with `reasoning_content`, an earlier turn with inline
`<think>...</think>` in its content, tools declared, tool calls with their results (arguments as an object,
as a JSON string, beside `content: None`, beside content and reasoning, several at once), a tool result
passed back as a user turn, content as a list of parts; thinking unset, on and off where the family has a
switch. The texts must be equal, but for:

- gpt-oss's `Current date:` line: both print the render date; it is masked so two renders a moment apart
  around midnight still compare.
- Declared tools, kept apart on purpose because the simulator reads them from the prompt
  (engine/sim/formats.py) to write tool calls: the real DeepSeek-R1 template ignores `tools`, the stand-in
  declares them after the system prompt (its declaration is cut out before comparing); gpt-oss's real
  template writes each function's parameters as TypeScript types, the stand-in as one line of JSON schema
  (the body of `namespace functions {...}` is masked on both sides, the rest of the developer message compared).
- Conversations a real template refuses (`REFUSED`, each with the template's reason): the real one must
  raise, the stand-in renders them (tests/worker/test_lean_render.py renders such a conversation with every
  stand-in).
- The Kimi templates queue call ids with `list.append`/`pop`, which transformers' sandbox refuses: through
  transformers they cannot render a conversation with tool calls at all (pinned by a test); there the real
  template is rendered in a sandbox that allows it, with transformers' message handling, and compared.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest

from datagen_operator.engine.reasoning import template_toggle
from datagen_operator.presets import presets
from datagen_operator.tokenizer.chat_template import _raise_exception, _strftime_now, _template_message, _tojson
from datagen_operator.tokenizer.families import FAMILIES
from datagen_operator.tokenizer.standin import chat_template, ensure_standin_tokenizer
from tests.real_templates import real_templates

REAL = {
    "kimi-k2-thinking": "Kimi-K2-Thinking.jinja",
    "kimi-k2-instruct": "Kimi-K2-Instruct.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "deepseek-r1": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "glm-4.5": "GLM-4.6.jinja",
    "gpt-oss": "openai-gpt-oss-120b.jinja",
}
NO_COUNTERPART = {
    "kimi-k2": "Kimi-K2.5/K2.6: no copy in the sdist",
    "qwen3-thinking-2507": "no copy in the sdist; held to the qwen3 stand-in plus its opener",
}
# Templates that mutate lists (refused by transformers' ImmutableSandboxedEnvironment once a call is rendered).
MUTATES_LISTS = {"kimi-k2-thinking", "kimi-k2-instruct"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Zeit für eine Zone — °C egal",
            "parameters": {
                "type": "object",
                "properties": {
                    "zone": {"type": "string", "enum": ["CET", "UTC"]},
                    "n": {"type": "array", "items": {"type": "integer"}},
                },
            },
        },
    },
]


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = _call("call_1", "get_weather", {"city": "Paris", "days": 2})
USER = {"role": "user", "content": "Weather in Paris?"}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'}
Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]
CONVERSATIONS: dict[str, Conversation] = {
    "plain": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], None),
    "no_system": ([{"role": "user", "content": "Hi there"}], None),
    "history_reasoning": (
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
         {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
         {"role": "user", "content": "Q3"}],
        None,
    ),
    "history_inline_think": (
        [{"role": "user", "content": "Q1"},
         {"role": "assistant", "content": "<think>\nR1 thoughts\n</think>\n\nA1"},
         {"role": "user", "content": "Q2"}],
        None,
    ),
    "tools": ([{"role": "system", "content": "Be brief."}, USER], TOOLS),
    "tool_round": (
        [USER, {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [WEATHER]},
         RESULT],
        TOOLS,
    ),
    "tool_round_json_arguments": (
        [USER,
         {"role": "assistant", "content": "", "tool_calls": [_call("call_1", "get_weather", '{"city": "Paris"}')]},
         RESULT],
        TOOLS,
    ),
    "tool_round_content_null": ([USER, {"role": "assistant", "content": None, "tool_calls": [WEATHER]}, RESULT], TOOLS),
    "tool_call_beside_content_and_reasoning": (
        [USER,
         {"role": "assistant", "content": "Let me check.", "reasoning_content": "Need the tool.",
          "tool_calls": [WEATHER]},
         RESULT, {"role": "assistant", "content": "It is 21.", "reasoning_content": "Got it."},
         {"role": "user", "content": "Thanks"}],
        TOOLS,
    ),
    "parallel_tool_calls": (
        [{"role": "system", "content": "Sé breve."}, {"role": "user", "content": "Paris and the time?"},
         {"role": "assistant", "content": "Checking both.",
          "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"}),
                         _call("call_2", "get_time", {"zone": "CET", "n": [1, 2]})]},
         {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
         {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
         {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And Rome?"},
         {"role": "assistant", "content": "", "tool_calls": [_call("call_3", "get_weather", {"city": "Rome"})]},
         {"role": "tool", "tool_call_id": "call_3", "content": "25C"}],
        TOOLS,
    ),
    "tool_result_as_user_turn": (
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
         {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}],
        None,
    ),
    "content_parts": (
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}],
        None,
    ),
}  # fmt: skip
# (family, conversation): why the real template raises on it.
_NULL_CONTENT = "transformers drops `content: None`; the template adds the missing content to a string"
REFUSED = {
    ("qwen3", "tool_round_content_null"): _NULL_CONTENT,
    ("deepseek-r1", "tool_round_content_null"): _NULL_CONTENT,
    ("qwen3", "content_parts"): "it reads a user content as a string (`startswith`)",
    ("deepseek-r1", "content_parts"): "it adds a user content to a string",
    ("gpt-oss", "content_parts"): "it adds a user content to a string",
    ("glm-4.5", "tool_round_json_arguments"): "it raises on tool-call arguments that are not a mapping",
    ("gpt-oss", "tool_call_beside_content_and_reasoning"): "it raises on content and thinking beside a tool call",
}


def _switch(family: str) -> str | None:
    """The family's thinking switch, as its presets name it."""
    return next((p.thinking.switch for p in presets().values() if p.family == family and p.thinking.switch), None)


def _variants(family: str) -> dict[str, dict[str, Any]]:
    variants: dict[str, dict[str, Any]] = {"default": {}}
    switch = _switch(family)
    if switch is not None:
        variants |= {"thinking_on": {switch: True}, "thinking_off": {switch: False}}
    if family == "gpt-oss":
        variants["reasoning_high"] = {"reasoning_effort": "high"}
    return variants


@dataclass(frozen=True)
class Case:
    family: str
    conversation: str
    variant: str

    @property
    def id(self) -> str:
        return f"{self.family}-{self.conversation}-{self.variant}"


CASES = [
    Case(family, conversation, variant)
    for family in REAL
    for conversation in CONVERSATIONS
    for variant in _variants(family)
]


@cache
def _tokenizer(family: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_standin_tokenizer(family=family)), local_files_only=True)


@cache
def _real(family: str) -> str:
    return real_templates(REAL.values())[REAL[family]]


def _apply(family: str, template: str, conversation: str, variables: dict[str, Any]) -> str:
    """transformers' rendering of `conversation` with `template`, through the family's stand-in tokenizer."""
    messages, tools = copy.deepcopy(CONVERSATIONS[conversation])
    text = _tokenizer(family).apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True, **variables
    )
    assert isinstance(text, str)
    return text


def _permissive(family: str, template: str, conversation: str, variables: dict[str, Any]) -> str:
    """What transformers would render were its sandbox to allow list mutation: the same Jinja settings, filters
    and globals, and the messages as transformers hands them over (None-valued keys dropped, reasoning under
    each name templates read, as datagen_operator.tokenizer.chat_template does)."""
    env = jinja2.sandbox.SandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    messages, tools = copy.deepcopy(CONVERSATIONS[conversation])
    plain = [_template_message(message) for message in messages]
    special = _tokenizer(family).special_tokens_map
    return env.from_string(template).render(
        messages=plain, tools=tools, documents=None, add_generation_prompt=True, **special, **variables
    )


def _render_real(case: Case) -> str:
    variables = _variants(case.family)[case.variant]
    try:
        return _apply(case.family, _real(case.family), case.conversation, variables)
    except jinja2.exceptions.SecurityError:
        if case.family not in MUTATES_LISTS:
            raise
        return _permissive(case.family, _real(case.family), case.conversation, variables)


def _render_standin(case: Case) -> str:
    variables = _variants(case.family)[case.variant]
    return _apply(case.family, chat_template(FAMILIES[case.family]), case.conversation, variables)


def _sub_once(pattern: str, replacement: str, text: str, where: str) -> str:
    """`text` with the one match of `pattern` replaced: a mask that finds nothing would hide nothing."""
    masked, count = re.subn(pattern, replacement, text, flags=re.DOTALL)
    assert count == 1, f"{where}: {pattern!r} matched {count} times"
    return masked


_DATE = r"Current date: \d{4}-\d{2}-\d{2}"
_NAMESPACE_BODY = r"namespace functions \{\n\n.*?\} // namespace functions"
_R1_DECLARATION = r"\n\n## Tools\n.*?\n## End of tools\n\nTo call functions, write .*?<｜tool▁calls▁end｜>\n"


def _masks(case: Case) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """(mask of the real render, mask of the stand-in's): the explained differences (module docstring)."""
    tools = CONVERSATIONS[case.conversation][1] is not None
    if case.family == "gpt-oss":

        def mask(text: str) -> str:
            text = _sub_once(_DATE, "Current date: <date>", text, case.id)
            return _sub_once(_NAMESPACE_BODY, "namespace functions {<declarations>}", text, case.id) if tools else text

        return mask, mask
    if case.family == "deepseek-r1" and tools:
        return (lambda text: text), (lambda text: _sub_once(_R1_DECLARATION, "", text, case.id))
    return (lambda text: text), (lambda text: text)


@pytest.mark.parametrize("case", [c for c in CASES if (c.family, c.conversation) not in REFUSED], ids=lambda c: c.id)
def test_standin_renders_as_the_real_template(case: Case) -> None:
    mask_real, mask_standin = _masks(case)
    assert mask_standin(_render_standin(case)) == mask_real(_render_real(case))


@pytest.mark.parametrize("case", [c for c in CASES if (c.family, c.conversation) in REFUSED], ids=lambda c: c.id)
def test_where_the_real_template_refuses_the_standin_renders(case: Case) -> None:
    with pytest.raises(Exception) as refused:  # each template fails in its own way
        _render_real(case)
    assert not isinstance(refused.value, AssertionError), refused.value
    assert _render_standin(case)


@pytest.mark.parametrize("family", sorted(MUTATES_LISTS))
def test_real_kimi_templates_cannot_render_tool_calls_through_transformers(family: str) -> None:
    """The reason their tool-call conversations are compared in a permissive sandbox; and that sandbox renders
    exactly as transformers does where transformers can render."""
    refused = []
    for conversation in CONVERSATIONS:
        try:
            rendered = _apply(family, _real(family), conversation, {})
        except jinja2.exceptions.SecurityError as error:
            assert "append" in str(error)
            refused.append(conversation)
            continue
        assert _permissive(family, _real(family), conversation, {}) == rendered, conversation
    assert refused == [
        name for name, (messages, _) in CONVERSATIONS.items() if any("tool_calls" in m for m in messages)
    ]


def test_qwen3_2507_is_the_hybrid_template_opening_think() -> None:
    """No 2507 template in the sdist: its stand-in is the qwen3 one (held to the real hybrid template above)
    with the prompt ending in the opener."""
    hybrid, thinking = chat_template(FAMILIES["qwen3"]), chat_template(FAMILIES["qwen3-thinking-2507"])
    for conversation in CONVERSATIONS:  # with the hybrid's switch off, which 2507's template no longer reads
        opened = _apply("qwen3-thinking-2507", thinking, conversation, {"enable_thinking": False})
        assert opened == _apply("qwen3", hybrid, conversation, {}) + "<think>\n", conversation


def test_every_family_is_compared_or_listed() -> None:
    assert set(REAL) | set(NO_COUNTERPART) == set(FAMILIES) and not set(REAL) & set(NO_COUNTERPART)
    assert {family for family, _ in REFUSED} <= set(REAL) and {c for _, c in REFUSED} <= set(CONVERSATIONS)


@pytest.mark.parametrize("family", sorted(REAL))
def test_sglang_reads_the_same_reasoning_switch_from_both(family: str) -> None:
    """SGLang decides whether chat output starts inside reasoning from the template's text (the simulator's
    port of its template detection): the stand-in's text must give the real one's answer."""
    assert template_toggle(chat_template(FAMILIES[family])) == template_toggle(_real(family))
