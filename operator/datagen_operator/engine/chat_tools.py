"""A dataset line's `tools`, read as SGLang's chat endpoint and SpecForge read them, in one shape for every caller:
OpenAI function tools `{"type": "function", "function": {name, description?, parameters?, ...}}`.

What the field writes, and how it is read here:

- `tools` as a JSON string (glaive, LLaMA-Factory; Parquet has no free-form JSON): parsed, as SpecForge's
  `safe_conversations_generator` and `preprocessing.py` `json.loads` it. A blank string is no tools; a string that
  is not JSON means nothing and the line is set aside (SpecForge warns and trains it without tools).
- A bare function object `{name, description?, parameters?}` (glaive), or the flat `{"type": "function", "name"}`:
  wrapped as `{"type": "function", "function": <the object>}`, the only shape SGLang's `Tool` model reads (its
  `function` is required). `{"function": {...}}` without `type` is a function tool: `Tool.type` defaults to it.
- Parameter types outside JSON Schema (`"dict"`, `"str"`, `"int"`, `"List[str]"`, LLaMA-Factory's
  reason_tool_use demo): rewritten as SGLang 0.5.23's request validation rewrites them in place before the template
  renders the tool (`function_call/utils.normalize_json_schema_types`, called by serving_chat `_validate_request`),
  so the template sees what the server's template sees. A type that stays outside JSON Schema after that
  (`"str, optional"`) fails SGLang's `Draft202012Validator.check_schema` and the server refuses the request
  (400): the line is set aside, naming the property.

tests/contract/test_dataset_tools.py holds `schema_types` to SGLang's own function and every tool read here to
SGLang's `Tool` model and schema check. The dict handed on is a new one: the line's object (hashed by the pin)
is never changed.
"""

from __future__ import annotations

from typing import Any

import orjson

STANDARD_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
# SGLang 0.5.23 function_call/utils.py `_JSON_SCHEMA_TYPE_ALIASES` and `_PREFIX_RULES`, as they are there.
TYPE_ALIASES: dict[str, str] = {
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string", "uuid": "string",
    "date": "string", "datetime": "string", "time": "string", "timestamp": "string", "binary": "string",
    "blob": "string", "bytea": "string", "bytes": "string", "varbinary": "string", "bool": "boolean",
    "bigint": "integer", "smallint": "integer", "tinyint": "integer", "double": "number", "decimal": "number",
    "real": "number", "numeric": "number", "arr": "array", "tuple": "array", "set": "array", "map": "object",
}  # fmt: skip
_PREFIX_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
_PREFIX_BOUNDARY = frozenset("0123456789[<( \t")
# The keys SGLang's walk descends into: a map of schemas, a list of schemas, one schema (or a list of them).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
NAMED_SHAPES = (
    'expected a list of {"type": "function", "function": {name, description?, parameters?}} or of bare function '
    "objects {name, description?, parameters?}"
)


def _type_of(raw: Any) -> Any:
    """One `type` value as SGLang rewrites it (`_normalize_single_type`)."""
    if not isinstance(raw, str) or raw in STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in STANDARD_TYPES:
        return base
    if base in TYPE_ALIASES:
        return TYPE_ALIASES[base]
    for prefixes, target in _PREFIX_RULES:
        # A prefix spans the name or is followed by a boundary: "int32" and "list[str]", not "internal".
        if any(base == p or (base.startswith(p) and base[len(p) : len(p) + 1] in _PREFIX_BOUNDARY) for p in prefixes):
            return target
    return raw


def schema_types(schema: Any) -> Any:
    """`schema` with its `type` values rewritten as SGLang's `normalize_json_schema_types` rewrites them in place,
    as a new value (what is not rewritten is shared with `schema`)."""
    if isinstance(schema, list):
        return [schema_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "type" in out:
        kind = out["type"]
        if isinstance(kind, str):
            out["type"] = _type_of(kind)
        elif isinstance(kind, list):
            kinds: list[Any] = []
            for item in kind:
                rewritten = _type_of(item)
                if rewritten not in kinds:
                    kinds.append(rewritten)
            out["type"] = kinds
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: schema_types(value) for name, value in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [schema_types(value) for value in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            out[key] = schema_types(out[key])
    return out


def request_tool(tool: Any) -> Any:
    """A chat request's tool as SGLang's `_validate_request` leaves it for the template: its parameter types
    rewritten (`schema_types`); anything else as it is (the simulator's chat endpoint)."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or function.get("parameters") is None:
        return tool
    return {**tool, "function": {**function, "parameters": schema_types(function["parameters"])}}


def _bad_type(schema: Any, where: str) -> str | None:
    """Where a rewritten schema still holds a `type` outside JSON Schema (SGLang's schema check refuses it)."""
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            found = _bad_type(item, f"{where}[{index}]")
            if found:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if "type" in schema and not all(isinstance(k, str) and k in STANDARD_TYPES for k in kinds):
        return f"{where}.type {_shown(kind)}"
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, value in schema[key].items():
                found = _bad_type(value, f"{where}.{key}.{name}")
                if found:
                    return found
    for key in (*_SCHEMA_LISTS, *_SCHEMA_ONE):
        if key in schema:
            found = _bad_type(schema[key], f"{where}.{key}")
            if found:
                return found
    return None


def read_tools(tools: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the tools as OpenAI function tools, or None for none; None) or (None, why they cannot be read)."""
    if tools is None:
        return None, None
    if isinstance(tools, str):
        if not tools.strip():
            return None, None
        try:
            tools = orjson.loads(tools)
        except orjson.JSONDecodeError as error:
            return None, f"tools is a string but not JSON ({error}); {NAMED_SHAPES}"
    if not isinstance(tools, list):
        return None, f"tools must be a list, got {json_type(tools)}"
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        read, problem = _read_tool(tool, f"tools[{index}]")
        if problem is not None:
            return None, problem
        assert read is not None
        out.append(read)
    return out or None, None


def _read_tool(tool: Any, where: str) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(tool, dict):
        return None, f"{where} must be an object, got {json_type(tool)}"
    if tool.get("type", "function") != "function":
        return None, f'{where}.type must be "function", got {_shown(tool.get("type"))}'
    if "function" in tool:
        function = tool["function"]
        if not isinstance(function, dict):
            return None, f"{where}.function must be an object, got {json_type(function)}"
        at = f"{where}.function"
    elif "name" in tool:
        function = {key: value for key, value in tool.items() if key != "type"}  # a bare function object
        at = where
    else:
        return None, f"{where} has neither function nor name; {NAMED_SHAPES}"
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"{at}.name must be a non-empty string, got {_shown(name)}"
    if function.get("description") is not None and not isinstance(function["description"], str):
        return None, f"{at}.description must be a string, got {json_type(function['description'])}"
    if function.get("strict") is not None and not isinstance(function["strict"], bool):
        return None, f"{at}.strict must be true or false, got {json_type(function['strict'])}"
    parameters = function.get("parameters")
    if parameters is not None:
        parameters = schema_types(parameters)
        problem = _parameters_problem(parameters, f"{at}.parameters")
        if problem is not None:
            return None, problem
        function = {**function, "parameters": parameters}
    read = dict(tool) if "function" in tool else {}
    read["type"] = "function"
    read["function"] = function
    return read, None


def _parameters_problem(parameters: Any, where: str) -> str | None:
    """Why rewritten parameters cannot declare a function tool. Stricter than SGLang's schema check in one place:
    the templates and tool-call parsers only understand an object schema (`properties` an object, `required` a
    list of names)."""
    if not isinstance(parameters, dict):
        return f"{where} must be a JSON-schema object, got {json_type(parameters)}"
    if parameters.get("type", "object") != "object":
        return f'{where} must have "type": "object", got {_shown(parameters.get("type"))}'
    if not isinstance(parameters.get("properties", {}), dict):
        return f"{where} properties must be an object, got {json_type(parameters['properties'])}"
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        return f"{where} required must be a list of property names"
    bad = _bad_type(parameters, where)
    if bad is not None:
        return (
            f"{bad} is no JSON-schema type, even as SGLang rewrites type names (str, int, dict, List[...]); its chat "
            "endpoint refuses the tool (invalid 'parameters' schema): write a JSON-schema type"
        )
    return None


def _shown(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()[:40]


def json_type(value: Any) -> str:
    """The JSON name of a value's type, as a dataset author would call it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__
