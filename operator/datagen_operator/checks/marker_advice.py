"""What to say when a model writes another family's think markers than the run expects: what was written, the
likely cause, and the fix presets/think_markers.py names (the preset to set, the model to point at, or the
reasoning parser to use). The canary's checks (checks/evaluate.py) and ParsersVerified (checks/server_truth.py)
say it alike."""

from __future__ import annotations

from collections.abc import Collection

from datagen_operator.presets.think_markers import MarkersWritten, ParserFix, fix_for


def wrong_markers_verdict(
    written: MarkersWritten, who: str, preset: str | None, expected: str | None, families: Collection[str] = ()
) -> str:
    """`who` ("7/7 outputs write", "the model writes") wrote another family's markers where the run expects
    `expected` (None: a preset that does not reason): what was written, what was expected, the likely cause and
    the fix named by presets/think_markers.py. The canary and ParsersVerified say it alike."""
    fix = fix_for(written, families)
    if expected is None:
        head = f"{who} {written.shown()} although {preset} does not reason"
    else:
        head = f"{who} {written.shown()}, not {preset or 'the run'}'s {expected}"
    if preset is None:
        cause = "the model at model.path writes other markers than server.reasoningParser reads"
        return f"{head}: {cause}; {parser_advice(fix)}"
    cause = f"the model at model.path is not a {preset} model, or {preset} is the wrong preset for it"
    return f"{head}: {cause}; {_preset_advice(fix, preset)}"


def _preset_advice(fix: ParserFix, preset: str) -> str:
    """Either side of a run whose preset and model disagree: the model to point at, or the preset to name."""
    model = f"point model.path at a {preset} model"
    if not fix.presets:
        parsers = " or ".join(fix.parsers)
        return (
            f"no preset writes them (SGLang reads them with reasoning parser {parsers}): {model}, or run this model "
            f"without a preset (server.reasoningParser: {parsers} and its server.toolCallParser)"
        )
    names = ", ".join(fix.presets)
    if fix.parser is not None and len(fix.presets) == 1:
        return f"they are preset {names}'s (reasoning parser {fix.parser}): {model}, or set model.preset: {names}"
    if fix.parser is not None:
        return (
            f"presets {names} write them (reasoning parser {fix.parser}): {model}, or set model.preset to one of them"
        )
    return (
        f"presets {names} write them (reasoning parsers {', '.join(fix.parsers)}) and the tokenizer does not tell "
        f"which: {model}, or set model.preset to the model's own"
    )


def parser_advice(fix: ParserFix) -> str:
    """The fix for a run that names its own reasoning parser: the one the markers and the family name, else the
    candidates (never the first parser that reads the markers)."""
    if fix.parser is not None:
        also = f"or set model.preset: {' or '.join(fix.presets)}" if fix.presets else "no preset writes these markers"
        return f"use {fix.parser} ({also})"
    if not fix.parsers:
        return "check the model's think tags"
    candidates = ", ".join(f"{parser} (preset {', '.join(fix.presets_of(parser))})" for parser in fix.parsers)
    return f"the markers do not tell the model's family: use its own reasoning parser, one of {candidates}"
