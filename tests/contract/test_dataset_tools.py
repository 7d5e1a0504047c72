"""A dataset line's tools, read by engine/chat_tools.py, held to SGLang 0.5.23's own chat endpoint: every tool read is
one SGLang admits (its `Tool` model, its `_validate_request`), with the parameter types SGLang's validation
leaves for the template; every tool set aside for a type name is one SGLang refuses."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.engine.chat_tools import TYPE_ALIASES, read_tools, schema_types
from tests.contract import sglang_side
from tests.contract.conftest import SGLang

SCHEMAS: list[Any] = [
    {"type": "dict", "properties": {"a": {"type": "str"}, "b": {"type": "int, optional"}}},
    {"type": "object", "properties": {"xs": {"type": "List[str]", "items": {"type": "str"}}}},
    {"type": ["int", "integer", "null"], "anyOf": [{"type": "float64"}, {"type": "varchar(255)"}]},
    {"type": "Dict[str, int]", "additionalProperties": {"type": "bool"}, "$defs": {"d": {"type": "decimal(10,2)"}}},
    {"type": "internal"},
    {"type": "list_price"},
    {"type": "uint8"},
    {"type": "STRING"},
    {"type": " map "},
    {"type": 3, "properties": {"x": {"type": "Enum"}}},
    {"type": "object", "properties": {"x": {"type": "str, optional"}}, "prefixItems": [{"type": "tuple"}]},
    {"items": [{"type": "long"}], "not": {"type": "short"}, "if": {"type": "num"}, "then": {"type": "dict"}},
    *({"type": name} for name in TYPE_ALIASES),
    ["not a schema"],
    "plain",
]


def test_parameter_types_are_rewritten_as_sglangs_request_validation_rewrites_them(sglang: SGLang) -> None:
    assert [schema_types(schema) for schema in SCHEMAS] == sglang.call(sglang_side.schema_types, SCHEMAS)


FIELD_TOOLS: list[Any] = [
    # glaive / LLaMA-Factory glaive_toolcall_en_demo: bare function objects in a JSON string
    '[{"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": '
    '{"q": {"type": "string"}}, "required": ["q"]}}]',
    # LLaMA-Factory reason_tool_use_demo: wrapped, database type names, `required` beside `parameters`
    [
        {
            "type": "function",
            "function": {
                "name": "asset",
                "description": "An asset.",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "id": {"type": "str", "default": "7"},
                        "n": {"type": "int"},
                        "xs": {"type": "List[int]"},
                    },
                },
                "required": ["id"],
            },
        }
    ],
    [{"function": {"name": "f"}}],  # no type: SGLang's Tool.type defaults to "function"
    [{"type": "function", "name": "g", "parameters": {"type": "object", "properties": {}}}],  # the flat shape
    [{"name": "h", "strict": True, "parameters": {"type": "object", "properties": {"x": {"type": "float"}}}}],
]


@pytest.mark.parametrize("tools", FIELD_TOOLS, ids=range(len(FIELD_TOOLS)))
def test_every_tool_read_is_one_sglang_admits_with_the_parameters_its_template_gets(sglang: SGLang, tools: Any) -> None:
    read, problem = read_tools(tools)
    assert problem is None and read
    verdict = sglang.call(sglang_side.chat_tools_verdict, read)
    assert "refused" not in verdict, verdict
    # Every field SGLang's Function keeps, as it keeps it (a key it ignores, `required` beside `parameters`, is the
    # render-time dump's to drop).
    for ours, theirs in zip(read, verdict["functions"], strict=True):
        assert {key: ours["function"].get(key) for key in theirs} == theirs
        assert theirs["name"] and ("parameters" in theirs) == ("parameters" in ours["function"])


REFUSED_TOOLS: list[Any] = [
    [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "str, optional"}}}}],
    [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "array", "items": {"type": "?"}}}}}],
    [{"name": "f", "parameters": {"type": "object", "anyOf": [{"type": ["string", "strung"]}]}}],
]


@pytest.mark.parametrize("tools", REFUSED_TOOLS, ids=range(len(REFUSED_TOOLS)))
def test_a_tool_set_aside_for_its_types_is_one_sglang_refuses(sglang: SGLang, tools: Any) -> None:
    read, problem = read_tools(tools)
    assert read is None and problem is not None and "is no JSON-schema type" in problem
    wrapped = [{"type": "function", "function": tool} for tool in tools]
    assert "invalid 'parameters' schema" in sglang.call(sglang_side.chat_tools_verdict, wrapped)["refused"]
