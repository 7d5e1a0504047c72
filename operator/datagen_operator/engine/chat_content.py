"""A message's `content` as SGLang's chat endpoint reads it and hands it to the chat template.

SGLang 0.5.23 (entrypoints/openai/protocol.py, serving_chat `_apply_jinja_template`,
parser/jinja_template_utils.py):

- A request's message content is a string, or a list of content parts (`ChatCompletionMessageContentPart`:
  `{"type": "text", "text": str}`, image/video/audio parts, thinking parts, GLM's tool_reference). A user message
  must have content (a string or a list); other roles may leave it out or null (then "" for the template).
- Before the template, each message with a list goes through `process_content_for_template_format`, by the
  template's content format (`detect_jinja_template_content_format`: "openai" when the template mentions image,
  audio, video or vision, or loops over `message.content`; "string" otherwise). "string": the text parts' text
  joined with one space ("" when there is none). "openai": the list kept, each text part as `{"type": "text",
  "text"}` (media parts become placeholders). Then `normalize_tool_content` joins a tool message's list of text
  parts with one space, whatever the format.
- An empty user message ("", or a list with no text) is not refused: `_validate_request` checks no content, so
  the template renders an empty user turn and the model answers it.

Here: a dataset line whose content holds a part other than text (an image, audio, video, thinking,
tool_reference or unknown part) is set aside (`NON_TEXT_CONTENT`): a text run cannot send it, and SGLang's
string format would drop it silently, so the answer would be to a message the dataset does not hold. A text
part without a string `text` (LLaMA-Factory's own `{"type": "text", "value"}`), content of another type, and a
user message without content are refused by SGLang's request model: set aside as `bad_messages`. The renderers
(prompts/render.py `Renderer`, prompts/lean_render.py `LeanRenderer`) hand the template `template_messages`,
held to SGLang's own functions by tests/contract/test_content_parts.py. Empty user messages are counted by the
preflight (steps/render_pass.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, Literal

from datagen_operator.engine.chat_tools import json_type

ContentFormat = Literal["string", "openai"]

NON_TEXT_CONTENT = "non_text_content"
"""A message's content holds a part that is not text (image, audio, ...): the line is set aside."""
TEXT_PART = "text"
_MEDIA_KEYWORDS = ("image", "audio", "video", "vision")


def content_format(chat_template: Any) -> ContentFormat:
    """The template's content format as SGLang detects it (`detect_jinja_template_content_format`)."""
    if isinstance(chat_template, dict):  # several named templates: the default one renders a chat
        chat_template = chat_template.get("default")
    return _string_template_format(chat_template) if isinstance(chat_template, str) else "string"


@cache
def _string_template_format(chat_template: str) -> ContentFormat:
    if any(keyword in chat_template for keyword in _MEDIA_KEYWORDS):
        return "openai"
    import jinja2.nodes

    tree = _parsed(chat_template)
    if tree is None:  # SGLang: a template its Jinja environment cannot parse is "string"
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        if any(_reads_content(loop.iter, name) for name in ("message", "msg", "m")):
            return "openai"
    return "string"


def _parsed(chat_template: str) -> Any:
    """The template's Jinja syntax tree, parsed as SGLang parses it (transformers' environment), or None. The
    project's copy of that environment first (no transformers import: the simulator renders with it); a
    template only transformers' own compiles (its `{% generation %}` tag) through transformers."""
    from datagen_operator.tokenizer.chat_template import compile_template

    try:
        return compile_template(chat_template).environment.parse(chat_template)
    except Exception:
        pass
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(chat_template).environment.parse(chat_template)
    except Exception:
        return None


def _reads_content(node: Any, name: str) -> bool:
    """SGLang's `_is_var_or_elems_access(node, name, "content")`: `name.content` or `name['content']`, through
    filters, tests and slices."""
    import jinja2.nodes as nodes

    if isinstance(node, nodes.Filter):
        return node.node is not None and _reads_content(node.node, name)
    if isinstance(node, nodes.Test):
        return _reads_content(node.node, name)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads_content(node.node, name)
    if isinstance(node, nodes.Getitem):
        return _is_name(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    if isinstance(node, nodes.Getattr):
        return _is_name(node.node, name) and node.attr == "content"
    return False


def _is_name(node: Any, name: str) -> bool:
    import jinja2.nodes as nodes

    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def template_messages(messages: Sequence[dict[str, Any]], form: ContentFormat) -> list[dict[str, Any]]:
    """The messages as serving_chat hands them to a template of content format `form`: a list content
    processed (`process_content_for_template_format`, then `normalize_tool_content`); every other message as
    it is (the same dict). The line's messages are never changed."""
    if not any(type(message.get("content")) is list for message in messages):
        return list(messages)
    return [
        _template_message(message, form) if type(message.get("content")) is list else message for message in messages
    ]


def _template_message(message: dict[str, Any], form: ContentFormat) -> dict[str, Any]:
    texts = [part["text"] for part in message["content"] if part.get("type") == TEXT_PART]
    out = {key: value for key, value in message.items() if value is not None}
    if form == "string" or message.get("role") == "tool":
        out["content"] = " ".join(texts)
    else:
        out["content"] = [{"type": TEXT_PART, "text": text} for text in texts]
    return out


def content_problem(message: dict[str, Any], where: str) -> tuple[bool, str] | None:
    """(whether it is a part that is not text, the reason) when the message's content cannot be sent: SGLang's
    chat endpoint would refuse it, or a part is not text (module doc); None when it can. `where` names the
    message."""
    role = message.get("role")
    if "content" not in message or message["content"] is None:
        if role == "user":
            return False, f"{where} is a user message without content (SGLang's chat endpoint requires it)"
        return None
    content = message["content"]
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return False, f"{where} content must be a string or a list of content parts, got {json_type(content)}"
    for index, part in enumerate(content):
        at = f"{where} content[{index}]"
        if not isinstance(part, dict):
            return False, f"{at} must be a content part object, got {json_type(part)}"
        kind = part.get("type")
        if kind != TEXT_PART:
            shown = repr(kind[:40]) if isinstance(kind, str) else json_type(kind)
            return True, (
                f"{at} is a {shown} part: only text parts can be sent to the model as text (SGLang would drop it "
                "from a string-format template's prompt, and the answer would be to a message the dataset does "
                "not hold)"
            )
        if not isinstance(part.get("text"), str):
            named = " (LLaMA-Factory's `value` is not OpenAI's `text`)" if "value" in part else ""
            return False, (
                f'{at} is a text part without a string "text"{named}: SGLang\'s chat endpoint reads '
                '{"type": "text", "text": "..."}'
            )
    return None


def message_text(message: dict[str, Any]) -> str:
    """A valid message's text as a string-format template gets it (parts joined), for counting empty ones."""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(part["text"] for part in content)
    return content if isinstance(content, str) else ""


def empty_user_messages(messages: Sequence[dict[str, Any]]) -> int:
    """User messages with no text (or only whitespace): SGLang answers them, as an empty user turn."""
    return sum(1 for message in messages if message.get("role") == "user" and not message_text(message).strip())
