"""Think markers: which reasoning parser reads which markers, and which model family writes them.

The one rule that names a reasoning parser from what a model actually wrote: ParsersVerified reads it off the
chat probe's text, the canary off raw output ids. Several parsers read `<think>`…`</think>` (kimi_k2, qwen3,
deepseek-r1, glm45, ...), so the markers alone never name one: the model's family does (the preset's, the
vocabulary's or, with no preset, the one the run's tool-call parser is for), then whether the model wrote the
opener itself (its template does not prefill it). When that still leaves several, the candidates are named,
never the first match. Pure data over presets.yaml and sglang_names.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple

from datagen_operator.presets import Preset, presets
from datagen_operator.presets.sglang_names import REASONING_PARSER_TAGS, resolved_tool_call_parser


class ThinkMarkers(NamedTuple):
    """The texts that open and close reasoning (harmony's opener is a three-token channel header)."""

    start: str
    end: str

    def shown(self) -> str:
        return f"`{self.start}`…`{self.end}`"


def preset_markers(preset: Preset) -> ThinkMarkers | None:
    """What the preset's model writes around its reasoning; None for a model that does not reason."""
    if preset.reasoning_format == "none" or preset.think_start is None or preset.think_end is None:
        return None
    return ThinkMarkers(preset.think_start.text, preset.think_end.text)


def markers_read_by(parser: str | None) -> ThinkMarkers | None:
    """The markers SGLang's reasoning parser looks for (its detector's start and end tokens)."""
    tags = REASONING_PARSER_TAGS.get(parser or "")
    return ThinkMarkers(*tags) if tags else None


def known_markers() -> tuple[ThinkMarkers, ...]:
    """Every distinct marker pair a preset writes or a listed parser reads, presets first."""
    found = [markers for preset in presets().values() if (markers := preset_markers(preset))]
    found += [ThinkMarkers(*tags) for tags in REASONING_PARSER_TAGS.values()]
    return tuple(dict.fromkeys(found))


def parsers_reading(markers: ThinkMarkers) -> tuple[str, ...]:
    """SGLang's reasoning parsers whose detector looks for these markers."""
    return tuple(name for name, tags in REASONING_PARSER_TAGS.items() if ThinkMarkers(*tags) == markers)


def tool_parser_families(tool_parser: str | None) -> tuple[str, ...]:
    """The families whose preset uses this tool-call parser (compared as SGLang resolves names): with no preset,
    the only word a run gives on its model's family."""
    if tool_parser is None:
        return ()
    wanted = resolved_tool_call_parser(tool_parser)
    found = (p.family for p in presets().values() if resolved_tool_call_parser(p.tool_call_parser) == wanted)
    return tuple(dict.fromkeys(found))


class MarkersWritten(NamedTuple):
    """Markers found in what a model wrote."""

    markers: ThinkMarkers
    opener_written: bool | None
    """The opener too (False: only the closer, the template opened the reasoning; None: not known)."""

    def shown(self) -> str:
        """As verdicts quote them: the closer alone when that is all the model wrote."""
        return self.markers.shown() if self.opener_written is not False else f"`{self.markers.end}`"


def written_in(text: str) -> MarkersWritten | None:
    """The known markers that occur first in `text` (a chat reply's content or reasoning), if any."""
    found: list[tuple[int, MarkersWritten]] = []
    for markers in known_markers():
        starts_at, ends_at = text.find(markers.start), text.find(markers.end)
        positions = [at for at in (starts_at, ends_at) if at >= 0]
        if positions:
            found.append((min(positions), MarkersWritten(markers, starts_at >= 0)))
    return min(found, key=lambda item: item[0])[1] if found else None


@dataclass(frozen=True)
class ParserFix:
    """The reasoning parser(s) for markers a model wrote: one is the fix; several are the candidates."""

    markers: ThinkMarkers
    parsers: tuple[str, ...]
    presets: tuple[str, ...]
    """The presets whose model writes these markers, narrowed as the parsers were (empty: no preset does)."""

    @property
    def parser(self) -> str | None:
        return self.parsers[0] if len(self.parsers) == 1 else None

    def presets_of(self, parser: str) -> tuple[str, ...]:
        return tuple(name for name in self.presets if presets()[name].reasoning_parser == parser)


def _narrowed(candidates: list[Preset], keep: Callable[[Preset], bool]) -> list[Preset]:
    """The candidates the evidence keeps; all of them when it keeps none (evidence the markers contradict, say a
    gpt-oss vocabulary whose model wrote `<think>`, tells nothing about which `<think>` family it is)."""
    kept = [preset for preset in candidates if keep(preset)]
    return kept or candidates


def fix_for(written: MarkersWritten, families: Collection[str] = ()) -> ParserFix:
    """The reasoning parser for what a model wrote: among the presets that write these markers, those of the
    model's families (when given), then those whose template leaves the opener to the model when it wrote one
    (prefills it when it did not). Markers no preset writes (`◁think▷`) are named by the parsers that read
    them."""
    writers = [preset for preset in presets().values() if preset_markers(preset) == written.markers]
    if not writers:
        return ParserFix(written.markers, parsers_reading(written.markers), ())
    if families:
        writers = _narrowed(writers, lambda preset: preset.family in families)
    if written.opener_written is not None:
        writers = _narrowed(writers, lambda p: p.thinking.prompt_prefills_opener is not written.opener_written)
    parsers = tuple(dict.fromkeys(p.reasoning_parser for p in writers if p.reasoning_parser))
    return ParserFix(written.markers, parsers, tuple(p.name for p in writers))
