"""The tools a chat template gets behind SGLang's chat endpoint: each request tool as `Tool.model_dump()` writes it.

SGLang 0.5.23 validates `tools` into its `Tool`/`Function` request models (entrypoints/openai/protocol.py) and hands
the template `[item.model_dump() for item in request.tools]` (serving_chat `_process_messages`). That dump is what
the model sees, so every prompt this project renders (workers, preflight, canary, verify, the simulator's chat
endpoint) renders it, not the dataset's dict:

- the tool: `type`, `function`, `defer_loading` in that order; `defer_loading` is written even when null (the
  `Tool` model has no serializer that drops it: about 14 ids a tool with Qwen3's template); other keys dropped;
- the function: the keys the client sent in the client's order (`key_order`), then the model's fields it left out
  (`description: null`, `parameters: null`); `strict` and `defer_loading` only when set; unknown keys dropped; a
  tool's `defer_loading` copied to its function's when that one is unset.

Held to SGLang's own code run on the same tools by tests/contract/test_template_inputs.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")
"""`Function`'s fields in declaration order (`key_order` is excluded from the dump)."""
_DROPPED_WHEN_NULL = ("strict", "defer_loading")
"""`Function._serialize` leaves these out when unset."""


class ToolShapeError(ValueError):
    """A tool SGLang's request models refuse (its chat endpoint answers 400): no prompt renders it."""


def _optional(value: Any, kind: type, where: str) -> Any:
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise ToolShapeError(f"{where} must be a {kind.__name__} or null, got {type(value).__name__}")
    return value


def template_tool(tool: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
    """One tool as `Tool.model_validate(tool).model_dump()` gives it (see the module docstring)."""
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise ToolShapeError(f"{where} must be an object with a function object")
    function: Mapping[str, Any] = tool["function"]
    if not isinstance(function.get("name"), str):
        raise ToolShapeError(f"{where}.function.name must be a string")
    tool_type = tool.get("type", "function")
    if not isinstance(tool_type, str):
        raise ToolShapeError(f"{where}.type must be a string")
    tool_defer = _optional(tool.get("defer_loading"), bool, f"{where}.defer_loading")
    _optional(function.get("description"), str, f"{where}.function.description")
    for flag in _DROPPED_WHEN_NULL:
        _optional(function.get(flag), bool, f"{where}.function.{flag}")
    data = {field: function.get(field) for field in _FUNCTION_FIELDS}
    if tool_defer is not None and data["defer_loading"] is None:
        data["defer_loading"] = tool_defer
    for flag in _DROPPED_WHEN_NULL:
        if data[flag] is None:
            del data[flag]
    sent = [key for key in function if key in data]
    dumped = {key: data[key] for key in [*sent, *(key for key in data if key not in sent)]}
    return {"type": tool_type, "function": dumped, "defer_loading": tool_defer}


def template_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A request's tools as its chat template sees them behind SGLang's chat endpoint (None: no tools)."""
    if not tools:
        return None
    return [template_tool(tool, index) for index, tool in enumerate(tools)]
