"""Cross-field rules: what the spec means once the preset is applied, or why it cannot be run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datagen_operator.api.errors import FieldError, SpecError
from datagen_operator.api.server_spec import NO_PARSER
from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.presets import Preset, get_preset, preset_names, presets
from datagen_operator.presets.sglang_names import (
    REASONING_PARSER_TAGS,
    resolved_reasoning_parser,
    resolved_tool_call_parser,
)


@dataclass(frozen=True)
class ResolvedModel:
    """The effective model knowledge for a run: preset defaults with the spec's explicit choices."""

    preset: Preset | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    thinking: bool
    think_start: str | None
    think_end: str | None
    trust_remote_code: bool
    template_variables: dict[str, Any] = field(default_factory=dict)
    """generation.templateVariables: rendered into every prompt, under a line's own chat_template_kwargs."""
    restarted_by_retraction: tuple[str, ...] = ()
    """The sampling parameters a retraction restarts (api.spec.SamplingParams.restarted_by_retraction)."""
    max_new_tokens: int | None = None
    """generation.sampling.max_new_tokens: an answer that ends `length` shorter was capped by the server."""


def _parser(value: str | None) -> str | None:
    return None if value == NO_PARSER else value


def _how_to_set_parsers() -> str:
    return (
        f"known presets: {', '.join(preset_names())}; for another model set model.preset to one of them, "
        "or set server.reasoningParser and server.toolCallParser explicitly (`none` for no parser), "
        "e.g. {reasoningParser: qwen3, toolCallParser: qwen25}"
    )


def resolve_model(spec: DataGenRunSpec) -> ResolvedModel:
    """Apply the preset; raise SpecError naming each contradiction and its fix."""
    errors: list[FieldError] = []
    server, model = spec.server, spec.model
    preset: Preset | None = None
    if model.preset is not None:
        if model.preset not in presets():
            errors.append(FieldError("spec.model.preset", f"unknown preset {model.preset!r}; {_how_to_set_parsers()}"))
        else:
            preset = get_preset(model.preset)
    elif server.reasoning_parser is None or server.tool_call_parser is None:
        errors.append(FieldError("spec.model.preset", f"no preset and no explicit parsers; {_how_to_set_parsers()}"))

    if preset is not None:
        errors += _contradictions(preset, server.reasoning_parser, server.tool_call_parser)
        reasoning = preset.reasoning_parser if server.reasoning_parser is None else _parser(server.reasoning_parser)
        tools = preset.tool_call_parser if server.tool_call_parser is None else _parser(server.tool_call_parser)
        thinking = preset.thinking.default if spec.generation.thinking is None else spec.generation.thinking
        if thinking and not preset.thinking.supported:
            errors.append(
                FieldError(
                    "spec.generation.thinking",
                    f"preset {preset.name} has no thinking mode; set generation.thinking: false or use a thinking preset",
                )
            )
        if not thinking and preset.thinking.supported and preset.thinking.switch is None:
            errors.append(
                FieldError(
                    "spec.generation.thinking",
                    f"preset {preset.name} always thinks (its template has no switch); remove generation.thinking: false",
                )
            )
        think_start = preset.think_start.text if preset.think_start else None
        think_end = preset.think_end.text if preset.think_end else None
        if model.think_tokens is not None:
            think_start, think_end = model.think_tokens.start, model.think_tokens.end
        trust = preset.trust_remote_code
    else:
        reasoning, tools = _parser(server.reasoning_parser), _parser(server.tool_call_parser)
        thinking = bool(spec.generation.thinking)
        tags = REASONING_PARSER_TAGS.get(reasoning or "", ("<think>", "</think>"))
        think_start, think_end = (model.think_tokens.start, model.think_tokens.end) if model.think_tokens else tags
        # Only an explicit `none`: parsers left unset are already named above (as the CRD's rule does).
        if thinking and server.reasoning_parser == NO_PARSER:
            errors.append(
                FieldError("spec.server.reasoningParser", "thinking is on but no reasoning parser is set; name one")
            )
        trust = False
    if model.trust_remote_code is not None:
        trust = model.trust_remote_code
    switches = {preset.thinking.switch} if preset is not None and preset.thinking.switch else set()
    for name in sorted(switches & spec.generation.template_variables.keys()):
        errors.append(FieldError("spec.generation.templateVariables", f"{name} is {THINKING_SWITCH_IN_VARIABLES}"))
    reserved = sorted(RESERVED_VARIABLES & spec.generation.template_variables.keys())
    for name in reserved:
        errors.append(FieldError("spec.generation.templateVariables", f"{name}: {RESERVED_IN_VARIABLES}"))
    errors += _mix_problems(spec)
    errors += _export_needs_conversations(spec)
    if errors:
        raise SpecError(errors)
    return ResolvedModel(
        preset=preset,
        reasoning_parser=reasoning,
        tool_call_parser=tools,
        thinking=thinking,
        think_start=think_start,
        think_end=think_end,
        trust_remote_code=trust,
        template_variables=dict(spec.generation.template_variables),
        restarted_by_retraction=spec.generation.sampling.restarted_by_retraction(),
        max_new_tokens=spec.generation.sampling.max_new_tokens,
    )


def _mix_problems(spec: DataGenRunSpec) -> list[FieldError]:
    """generation.templateVariableMix draws variables the run does not set itself (CEL cannot read the keys of the
    free-form templateVariables: these rules are validate's and the operator's InvalidSpec, not the CRD's)."""
    mix = spec.generation.template_variable_mix
    if mix is None:
        return []
    field = "spec.generation.templateVariableMix.variables"
    errors = [
        FieldError(
            field,
            f"{name} is also set in spec.generation.templateVariables: a variable is either the run's (there) or "
            "drawn per line (here); remove it from one of them",
        )
        for name in sorted(mix.variables.keys() & spec.generation.template_variables.keys())
    ]
    errors += [
        FieldError(field, f"{name}: {RESERVED_IN_VARIABLES}")
        for name in sorted(RESERVED_VARIABLES & mix.variables.keys())
    ]
    return errors


def _export_needs_conversations(spec: DataGenRunSpec) -> list[FieldError]:
    """Whole-conversation rows and the conversations format exist only for an output of whole conversations."""
    export = spec.export
    if export is None or spec.generation.turns == "all":
        return []
    errors = []
    if export.rows == "conversations":
        errors.append(FieldError("spec.export", f"rows: conversations: {EXPORT_NEEDS_CONVERSATIONS}"))
    if "conversations" in export.formats:
        errors.append(FieldError("spec.export", f"formats: conversations: {EXPORT_NEEDS_CONVERSATIONS}"))
    return errors


EXPORT_NEEDS_CONVERSATIONS = (
    "whole-conversation rows and the conversations format need regenerated conversations: set "
    "generation.turns: all, or export rows: turns with the token formats"
)
THINKING_SWITCH_IN_VARIABLES = (
    "the template's thinking switch: set generation.thinking instead (a dataset line may still switch it for itself "
    "with its own chat_template_kwargs)"
)
RESERVED_IN_VARIABLES = "the renderer gives the template these itself"


RESERVED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "datagen_rendered_on"})
"""What the renderer gives a chat template itself: neither the run nor a line may set it."""


def _contradictions(preset: Preset, reasoning: str | None, tools: str | None) -> list[FieldError]:
    errors: list[FieldError] = []
    wanted_reasoning = preset.reasoning_parser or NO_PARSER
    # Names are compared as SGLang resolves them: `qwen` is what `qwen25` becomes, so both are right.
    if reasoning is not None and resolved_reasoning_parser(reasoning) != resolved_reasoning_parser(wanted_reasoning):
        why = ""
        if reasoning in REASONING_PARSER_TAGS and preset.think_start is not None:
            tag = REASONING_PARSER_TAGS[reasoning][0]
            if tag != preset.think_start.text:
                why = f": it looks for {tag} but {preset.name} writes {preset.think_start.text}"
        elif reasoning == NO_PARSER:
            why = ": without it the reasoning is hidden inside content and reasoning_content is null"
        errors.append(
            FieldError(
                "spec.server.reasoningParser",
                f"{reasoning!r} contradicts preset {preset.name}{why}; use {wanted_reasoning} (or leave it unset)",
            )
        )
    wanted_tools = preset.tool_call_parser or NO_PARSER
    if tools is not None and resolved_tool_call_parser(tools) != resolved_tool_call_parser(wanted_tools):
        errors.append(
            FieldError(
                "spec.server.toolCallParser",
                f"{tools!r} contradicts preset {preset.name}; use {wanted_tools} (or leave it unset)",
            )
        )
    return errors


def preset_thinking_switch(name: str) -> str | None:
    """The template variable that switches thinking for the preset of this name (an output's fingerprint names
    its preset), None when its template cannot switch. ValueError: a preset this datagen does not know."""
    try:
        return get_preset(name).thinking.switch
    except KeyError as error:
        raise ValueError(str(error.args[0])) from None
