"""What an export is asked for (`ExportOptions`, the run's dataset, the tokenizer's codec) and why options cannot
export an output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from datagen_operator.api.export_spec import EXPORT_FORMATS, whole_conversations_asked
from datagen_operator.export.conversations import MESSAGES_KEYS, RERENDERED_POLICIES, ROWS
from datagen_operator.export.formats import Selection
from datagen_operator.export.reader import BATCH_TOKENS
from datagen_operator.export.writer import DEFAULT_PART_BYTES
from datagen_operator.prompts.dataset_ref import DatasetRef
from datagen_operator.prompts.draws import VariableDraws

if TYPE_CHECKING:
    from datagen_operator.prompts.lines import Prompt

TOKEN_FORMATS = ("speculators", "trl")
"""The formats --rows conversations applies to: rows of exact token ids with a loss mask."""


@dataclass(frozen=True)
class DatasetSource:
    """The run's dataset: what the planned turns and the conversations format's messages are read from."""

    ref: DatasetRef
    draws: VariableDraws | None = None
    """generation.templateVariableMix: each line's drawn variables are in its prompt's (prompt_from)."""

    def prompts(self, wanted: set[str]) -> Iterator[Prompt]:
        """The valid prompts whose id is in `wanted`, in dataset order (one streamed pass)."""
        from datagen_operator.prompts.lines import MalformedLine, prompt_from
        from datagen_operator.prompts.scan import ShardScan

        for item in ShardScan(replace(self.ref, sample=None), 0, 1):  # `wanted` holds the subset
            if isinstance(item, MalformedLine):
                continue
            ref, obj = item
            if ref.id in wanted:
                yield prompt_from(ref, obj, self.draws)


@dataclass(frozen=True)
class ExportOptions:
    export_format: str
    selection: Selection = field(default_factory=Selection)
    last_turn_only: bool = False
    part_bytes: int = DEFAULT_PART_BYTES
    batch_tokens: int = BATCH_TOKENS
    rows: str = "turns"  # conversations.ROWS; the token formats only
    rerendered_spans: str = "unmasked"  # conversations.RERENDERED_POLICIES
    dataset: DatasetSource | None = None  # planned turns (whole conversations) and the conversations format's messages
    messages_key: str = "conversations"  # conversations.MESSAGES_KEYS

    def to_json(self) -> dict[str, Any]:
        selection = asdict(self.selection)
        selection["exclude_flags"] = sorted(self.selection.exclude_flags)
        whole = whole_conversations_asked(self.rows, (self.export_format,))
        out = {
            **selection,
            "last_turn_only": self.last_turn_only,
            # Token formats always supervise the completion only: that IS the last assistant turn.
            "last_turn_only_applies": self.export_format == "text",
            "part_bytes": self.part_bytes,
            "rows": "conversations" if self.export_format == "conversations" else self.rows,
            "dataset": str(self.dataset.ref.path) if self.dataset is not None and whole else None,
        }
        if self.rows == "conversations":
            out["rerendered_spans"] = self.rerendered_spans
        if self.export_format == "conversations":
            out["messages_key"] = self.messages_key
            out["max_length_applies"] = False  # the trainer renders the text: its own max_length cuts
        return out


ConversationRender = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any] | None], list[int]]
"""(messages, tools, chat_template_kwargs) -> the ids a template-based trainer trains on for the whole conversation."""


@dataclass(frozen=True)
class TextCodec:
    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]
    vocab_size: int | None
    render_conversation: ConversationRender | None = None


def codec_from_tokenizer(tokenizer: Any) -> TextCodec:
    from datagen_operator.prompts.render import backend_encoder

    # No special tokens added: the decoded text already holds the template's own (BOS included, if any).
    encode = backend_encoder(tokenizer) or (lambda text: tokenizer.encode(text, add_special_tokens=False))

    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return text

    def render_conversation(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None
    ) -> list[int]:
        # As SpecForge's GeneralParser/ThinkingParser (specforge/data/parse.py) and TRL's `messages` render a
        # conversation to train on: the whole of it, no generation prompt, then the text tokenized.
        text = tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=False, **(kwargs or {})
        )
        return list(encode(text))

    return TextCodec(decode, encode, len(tokenizer), render_conversation)


def options_problem(options: ExportOptions, source_turns: str) -> str | None:
    """Why these options cannot export this output (its `generation.turns`), or None."""
    if options.export_format not in EXPORT_FORMATS:
        return f"unknown format {options.export_format!r}; one of {', '.join(EXPORT_FORMATS)}"
    if options.rows not in ROWS:
        return f"unknown --rows {options.rows!r}; one of {', '.join(ROWS)}"
    if options.rerendered_spans not in RERENDERED_POLICIES:
        return f"unknown --rerendered-spans {options.rerendered_spans!r}; one of {', '.join(RERENDERED_POLICIES)}"
    if options.messages_key not in MESSAGES_KEYS:
        return f"unknown --messages-key {options.messages_key!r}; one of {', '.join(MESSAGES_KEYS)}"
    if options.rows == "conversations" and options.export_format not in TOKEN_FORMATS:
        return (
            f"--rows conversations is for the token formats ({', '.join(TOKEN_FORMATS)}); "
            "--format conversations writes whole conversations as text"
        )
    whole = whole_conversations_asked(options.rows, (options.export_format,))
    if whole and source_turns != "all":
        return (
            "whole conversations are exported from an output of generation.turns: all (regenerated conversations); "
            f"this one is generation.turns: {source_turns} (one answer per line: --rows turns)"
        )
    if options.export_format == "conversations" and options.dataset is None:
        return "the conversations format needs the run's dataset (its user turns): pass --dataset FILE"
    return None
