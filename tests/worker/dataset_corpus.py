"""Prompt objects the dataset rules judge: tool schemas SGLang's chat endpoint would refuse (with the reason
we name) and ones it accepts. Used by test_dataset_edges.py (each case through a plan) and test_dataset_scan.py
(the scan's fast path against validate_prompt)."""

from __future__ import annotations

from typing import Any

from tests.worker.simrun import TOOLS

GOOD_FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}
INVALID_TOOLS_CASES: list[tuple[Any, str]] = [
    ({"type": "function", "function": GOOD_FUNCTION}, "tools must be a list, got object"),
    (["get_weather"], "tools[0] must be an object, got string"),
    ([{"type": "retrieval", "function": GOOD_FUNCTION}], 'tools[0].type must be "function", got "retrieval"'),
    ([{"type": "function", "function": None}], "tools[0].function must be an object, got null"),
    ([{"type": "function"}], "tools[0] has neither function nor name; expected a list of"),
    ("[{", "tools is a string but not JSON ("),
    ('{"name": "f"}', "tools must be a list, got object"),
    (
        [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "str, optional"}}}}],
        'tools[0].parameters.properties.x.type "str, optional" is no JSON-schema type',
    ),
    ([{"type": "function", "function": {"parameters": {}}}], "tools[0].function.name must be a non-empty string"),
    ([{"type": "function", "function": {"name": 7}}], "tools[0].function.name must be a non-empty string, got 7"),
    ([{"type": "function", "function": {"name": " "}}], "tools[0].function.name must be a non-empty string"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "function.description must be a string"),
    ([{"type": "function", "function": {"name": "f", "strict": "yes"}}], "function.strict must be true or false"),
    (
        [{"type": "function", "function": {"name": "f", "parameters": ["x"]}}],
        "tools[0].function.parameters must be a JSON-schema object, got array",
    ),
    (
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
        'tools[0].function.parameters must have "type": "object", got "string"',
    ),
    (
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": ["x"]}}}],
        "parameters properties must be an object, got array",
    ),
    (
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": [1]}}}],
        "parameters required must be a list of property names",
    ),
    ([*TOOLS, {"type": "function", "function": {}}], "tools[1].function.name must be a non-empty string"),
]
VALID_TOOLS_CASES: list[Any] = [
    TOOLS,
    [{"type": "function", "function": {"name": "f"}}],  # SGLang: parameters optional
    [{"type": "function", "function": {"name": "f", "parameters": {}, "description": None, "strict": True}}],
    [{"type": "function", "function": {"name": "f", "parameters": None}, "extra": 1}],  # unknown keys ignored
    [],  # no tools
    None,
    [{"function": GOOD_FUNCTION}],  # SGLang's Tool.type defaults to "function"
    '[{"type": "function", "function": {"name": "f"}}]',  # a JSON string (glaive, LLaMA-Factory)
    [{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "int"}}}}],  # bare; SGLang's types
    "",  # a blank string: no tools
]
