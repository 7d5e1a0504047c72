"""The CustomResourceDefinition, generated from the pydantic models (never edited by hand)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from datagen_operator.api.extra_args import extra_arg_cel_rules, speculative_sampling_cel_rules
from datagen_operator.api.names import (
    NAME_CHARACTERS_MESSAGE,
    RUN_NAME_PATTERN,
    max_run_name_length,
    name_length_message,
)
from datagen_operator.api.resolve import EXPORT_NEEDS_CONVERSATIONS
from datagen_operator.api.server_spec import NO_PARSER, OWNED_SERVER_FIELDS, ServerSpec, external_server_refusal
from datagen_operator.api.spec import API_GROUP, API_VERSION, KIND, PLURAL, DataGenRunSpec
from datagen_operator.api.status import (
    CANARY_PASSED,
    DATA_FAITHFUL,
    PARSERS_VERIFIED,
    SERVER_READY,
    SPEC_APPLIED,
    SUCCEEDED,
    DataGenRunStatus,
)
from datagen_operator.presets import preset_names, presets
from datagen_operator.presets.sglang_names import (
    REASONING_PARSER_NAMES,
    TOOL_CALL_PARSER_NAMES,
    resolved_reasoning_parser,
    resolved_tool_call_parser,
)

SHORT_NAMES = ["dgr"]


def _resolve_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**_resolve_refs(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve_refs(merged, defs)
        return {key: _resolve_refs(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolve_refs(item, defs) for item in node]
    return node


def _structural(node: Any) -> Any:
    """JSON Schema (pydantic) -> Kubernetes structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:  # Optional[X]: the field is simply not required; null is not a value we accept
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) == 1:
            node = {**branches[0], **node}
        else:
            node["anyOf"] = branches
    node.pop("title", None)
    if node.get("additionalProperties") is False:  # unknown fields: pruned and warned by the API server
        node.pop("additionalProperties")
    if node.get("additionalProperties") is True:  # free-form (affinity): said by preserve-unknown-fields
        node.pop("additionalProperties")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("default") is None:
        node.pop("default", None)
    elif isinstance(node.get("default"), dict | list) and not node["default"]:
        node.pop("default")  # empty collections: leave unset rather than store noise in every object
    out = {key: _structural(value) for key, value in node.items()}
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def cel_map(mapping: Mapping[str, Any]) -> str:
    """A CEL map literal of `mapping`, keys sorted."""
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(mapping.items())) + "}"


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema: dict[str, Any] = _structural(_resolve_refs(raw, defs))
    return schema


def _cel_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _same_parser(wanted: str | None, names: tuple[str, ...], resolved: Any) -> list[str]:
    """Every spelling SGLang runs as the preset's parser (`qwen25` and `qwen` are one parser), as resolve.py
    compares them."""
    wanted = wanted or NO_PARSER
    return sorted(n for n in (*names, NO_PARSER) if resolved(n) == resolved(wanted))


def _spec_rules() -> list[dict[str, str]]:
    """Cross-field rules the API server can enforce itself, generated from the preset data; the same rules
    as resolve.py's (a unit test and tests/operator/test_schema_corpus.py hold them to one verdict)."""
    table = presets()
    reasoning = {
        name: _same_parser(p.reasoning_parser, REASONING_PARSER_NAMES, resolved_reasoning_parser)
        for name, p in table.items()
    }
    tools = {
        name: _same_parser(p.tool_call_parser, TOOL_CALL_PARSER_NAMES, resolved_tool_call_parser)
        for name, p in table.items()
    }
    no_thinking = [name for name, p in table.items() if not p.thinking.supported]
    always_thinking = [name for name, p in table.items() if p.thinking.supported and p.thinking.switch is None]
    return [
        {
            "rule": "has(self.model.preset) || (has(self.server.reasoningParser) && has(self.server.toolCallParser))",
            "message": f"no preset and no explicit parsers: set model.preset (one of {', '.join(preset_names())}) "
            "or set server.reasoningParser and server.toolCallParser (`none` for no parser)",
            "fieldPath": ".model.preset",
            "reason": "FieldValueRequired",
        },
        {
            "rule": f"!has(self.model.preset) || !has(self.server.reasoningParser) || "
            f"self.server.reasoningParser in {cel_map(reasoning)}[self.model.preset]",
            "message": "server.reasoningParser contradicts the preset (e.g. kimi looks for ◁think▷ but kimi-k2.5 "
            "writes <think>); leave it unset or use the preset's parser (`datagen presets`)",
            "fieldPath": ".server.reasoningParser",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"!has(self.model.preset) || !has(self.server.toolCallParser) || "
            f"self.server.toolCallParser in {cel_map(tools)}[self.model.preset]",
            "message": "server.toolCallParser contradicts the preset; leave it unset or use the preset's parser",
            "fieldPath": ".server.toolCallParser",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"!(has(self.model.preset) && self.model.preset in {_cel_list(no_thinking)} && "
            "has(self.generation.thinking) && self.generation.thinking)",
            "message": "this preset has no thinking mode; set generation.thinking: false or use a thinking preset",
            "fieldPath": ".generation.thinking",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": f"!(has(self.model.preset) && self.model.preset in {_cel_list(always_thinking)} && "
            "has(self.generation.thinking) && !self.generation.thinking)",
            "message": "this preset always thinks (its template has no switch); remove generation.thinking: false",
            "fieldPath": ".generation.thinking",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "!has(self.export) || self.generation.turns == 'all' || "
            "(self.export.rows != 'conversations' && !('conversations' in self.export.formats))",
            "message": f"spec.export: {EXPORT_NEEDS_CONVERSATIONS}",
            "fieldPath": ".export",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": "has(self.model.preset) || !has(self.generation.thinking) || !self.generation.thinking || "
            f"!has(self.server.reasoningParser) || self.server.reasoningParser != {json.dumps(NO_PARSER)}",
            "message": "thinking is on but no reasoning parser is set; name one",
            "fieldPath": ".server.reasoningParser",
            "reason": "FieldValueInvalid",
        },
    ]


def external_server_cel_rules() -> list[dict[str, str]]:
    """With server.external, each field of an owned server at its default, as ServerSpec._external_owns_nothing
    checks it (the API server fills the defaults in before CEL sees them, so `set` reads `not the default`)."""
    rules = []
    for name in OWNED_SERVER_FIELDS:
        alias = to_camel(name)
        default = ServerSpec.model_fields[name].get_default(call_default_factory=True)
        if default is None or name == "affinity":
            # affinity keeps unknown fields, so CEL cannot size it: an explicit `affinity: {}` is refused here alone.
            unchanged = f"!has(self.{alias})"
        elif isinstance(default, list | dict):
            unchanged = f"!has(self.{alias}) || size(self.{alias}) == 0"
        else:
            unchanged = f"!has(self.{alias}) || self.{alias} == {json.dumps(default)}"
        rules.append(
            {
                "rule": f"!has(self.external) || {unchanged}",
                "message": external_server_refusal(alias),
                "fieldPath": f".{alias}",
                "reason": "FieldValueForbidden",
            }
        )
    return rules


def _spec_schema() -> dict[str, Any]:
    schema = model_schema(DataGenRunSpec)
    props = schema["properties"]
    props["model"]["properties"]["preset"]["enum"] = preset_names()
    server = props["server"]
    server["properties"]["reasoningParser"]["enum"] = [*sorted(REASONING_PARSER_NAMES), NO_PARSER]
    server["properties"]["toolCallParser"]["enum"] = [*sorted(TOOL_CALL_PARSER_NAMES), NO_PARSER]
    server["default"] = {}  # so the server's own defaults (gpus, image, ...) are filled in and CEL sees them
    for section in ("clients", "checks"):
        props[section]["default"] = {}

    def one_volume() -> dict[str, str]:  # a fresh dict each time: no YAML anchors in the output
        return {
            "rule": "[has(self.persistentVolumeClaim), has(self.hostPath), has(self.nfs)].filter(x, x).size() == 1",
            "message": "set exactly one of persistentVolumeClaim, hostPath, nfs",
        }

    for section in ("model", "dataset", "output"):
        props[section]["properties"]["volume"]["x-kubernetes-validations"] = [one_volume()]
    server["properties"]["extraArgs"]["items"]["x-kubernetes-validations"] = extra_arg_cel_rules()
    server["x-kubernetes-validations"] = [*server.get("x-kubernetes-validations", []), *external_server_cel_rules()]
    env_items = server["properties"]["env"]["items"]
    env_items["x-kubernetes-validations"] = [
        {"rule": "has(self.value) != has(self.valueFrom)", "message": "set exactly one of value, valueFrom"}
    ]
    schema["x-kubernetes-validations"] = _spec_rules() + speculative_sampling_cel_rules()
    return schema


def _metadata_schema() -> dict[str, Any]:
    """metadata.name as the run's children need it (the API server alone allows any DNS subdomain)."""
    rules = [
        {"rule": f"self.size() <= {max_run_name_length()}", "message": name_length_message()},
        {"rule": f"self.matches({json.dumps(RUN_NAME_PATTERN)})", "message": NAME_CHARACTERS_MESSAGE},
    ]
    return {"type": "object", "properties": {"name": {"type": "string", "x-kubernetes-validations": rules}}}


def _condition_column(name: str, condition: str, priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{condition}")].status',
    }
    if priority:
        column["priority"] = priority
    return column


def _status_schema() -> dict[str, Any]:
    schema = model_schema(DataGenRunStatus)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"  # one entry per type; server-side apply merges by type
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def crd_manifest() -> dict[str, Any]:
    status_schema = _status_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        # What the run is doing, in one word: a halt reads Halted, not the last step it was at.
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        _condition_column("Succeeded", SUCCEEDED),
                        _condition_column("Server", SERVER_READY),
                        _condition_column("Parsers", PARSERS_VERIFIED, priority=1),
                        _condition_column("Canary", CANARY_PASSED),
                        _condition_column("Faithful", DATA_FAITHFUL),
                        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
                        # Empty until a change is refused: then DataFieldsFrozen (the run keeps its applied spec,
                        # so Phase says Running over a change that is not running), Applied once reverted.
                        {
                            "name": "Spec",
                            "type": "string",
                            "jsonPath": f'.status.conditions[?(@.type=="{SPEC_APPLIED}")].reason',
                        },
                        {
                            "name": "Reason",
                            "type": "string",
                            "jsonPath": f'.status.conditions[?(@.type=="{SUCCEEDED}")].reason',
                            "priority": 1,
                        },
                        {
                            "name": "Message",
                            "type": "string",
                            "jsonPath": f'.status.conditions[?(@.type=="{SUCCEEDED}")].message',
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A generation run: an SGLang server for a model, sharded client workers "
                            "that record raw token ids, and checks that prove the data is faithful.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": _metadata_schema(),
                                "spec": _spec_schema(),
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# GENERATED by `datagen crd` from operator/datagen_operator/api/ -- do not edit; run `make crd`.\n"
    return header + yaml.dump(crd_manifest(), Dumper=_NoAliasDumper, sort_keys=False, allow_unicode=True, width=120)


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True
