"""The export's own manifest (`export-manifest.json`): where the data came from, what went out, what
was left out and why. Written last: its presence means the export finished."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.export.conversations import RERENDERED_SPAN, TRAINER_RERENDERED
from datagen_operator.output.layout import write_atomic
from datagen_operator.output.manifest import read_manifest

MANIFEST_NAME = "export-manifest.json"
EXPORT_FORMAT = "datagen-export/v1"
EXAMPLES_PER_REASON = 5
LOSSY_NOTE = (
    "text is decoded from the token ids; a trainer re-tokenizes it, and decode-then-encode is not always the "
    "identity: rows with roundtrip_ok false would train on other ids than the model generated"
)
CONVERSATIONS_NOTE = (
    "messages, not token ids: a trainer renders them with its own chat template and tokenizer, which keeps what "
    "it keeps of earlier answers' reasoning_content (Qwen3's drops it before the last user message) and need "
    "not give back the ids the model generated; the token formats with --rows conversations keep them exact"
)
LOSS_TURNS = "completion tokens only (final stop token included), not shifted; the prompt is always whole"
LOSS_CONVERSATIONS = (
    "the last turn's completion and every earlier answer the row holds verbatim (its record's output_ids, stop "
    "token included), not shifted; earlier answers re-rendered by the template are context (mask 0)"
)


SUPERVISED_MEANS = {
    "speculators": "tokens with loss_mask 1: each one a token of a record's output_ids, where the model generated it",
    "trl": "tokens with assistant_masks 1: each one a token of a record's output_ids, where the model generated it",
    "text": (
        "the completion (the record's output_ids) of each row whose text re-encodes to the exact ids (roundtrip_ok): "
        "what a trainer supervising the row's generated turn trains on as the model generated it"
    ),
    "conversations": (
        "the output_ids of every answer the rows hand over as an assistant message that the model's chat template, "
        "rendering the whole conversation as a trainer does (trainer_render), holds verbatim; without a tokenizer to "
        "measure that, every answer: the most a trainer supervising every assistant turn trains on"
    ),
}
"""What `supervised_tokens` counts, per format (docs/export.md, "What will be trained")."""


def supervision(export_format: str, rows: str, tally: ExportTally, *, last_turn_only: bool) -> dict[str, Any]:
    """Supervised against generated tokens: the ratio, the generated tokens no row supervises by reason, and the
    one line the CLI prints. Every generated token is supervised at most once in every format, so
    supervised + sum(unsupervised_tokens) = generated (the text format's history answers aside: `notes`)."""
    supervised, generated = tally.supervised_tokens, tally.generated_tokens
    ratio = supervised / generated if generated else None
    line = f"supervised / generated = {supervised} / {generated}" + (f" = {ratio:.2f}" if ratio is not None else "")
    notes = []
    if rows == "conversations" and export_format != "conversations" and tally.conversation_spans_rerendered:
        notes.append(
            f"whole-conversation rows supervise only the answers they hold verbatim: "
            f"{tally.conversation_spans_rerendered} earlier answers ({tally.unsupervised[RERENDERED_SPAN]} tokens) "
            "are held as the chat template re-rendered them (a thinking model's history drops their reasoning) and "
            "are not supervised; per-turn rows (--rows turns) supervise every generated token once"
        )
    if export_format == "text" and tally.history_answers and not last_turn_only:
        notes.append(
            f"a trainer supervising every assistant turn of a text also trains on the {tally.history_answers} "
            "earlier answers the rows' prompts hold, as the template re-rendered them (not counted): --last-turn-only"
        )
    if export_format == "conversations" and tally.unsupervised[TRAINER_RERENDERED]:
        notes.append(
            f"a trainer rendering these messages with the model's chat template (SpecForge, TRL) re-renders "
            f"{tally.unsupervised[TRAINER_RERENDERED]} generated tokens (trainer_render), not supervised as written"
        )
    elif export_format == "conversations":
        notes.append("answers as messages: what the trainer's template keeps of them is its own (lossy)")
    if tally.turns_not_generated:
        cut = ", ".join(f"{reason} {n}" for reason, n in sorted(tally.turns_not_generated.items()))
        notes.append(f"planned turns never generated (the conversation ended before them): {cut}")
    if notes:
        line += " (" + "; ".join(notes) + ")"
    return {
        "supervised_tokens": supervised,
        "generated_tokens": generated,
        "ratio": round(ratio, 4) if ratio is not None else None,
        "supervised_means": SUPERVISED_MEANS[export_format],
        "unsupervised_tokens": dict(sorted(tally.unsupervised.items())),
        "turns_not_generated": dict(sorted(tally.turns_not_generated.items())),
        "history_answers": tally.history_answers if export_format == "text" and not last_turn_only else 0,
        "notes": notes,
        "line": line,
    }


def describe_source(output_dir: Path) -> dict[str, Any]:
    """The run's identity and state from its manifest.json (fingerprint, turns, shards, complete or not)."""
    manifest = read_manifest(output_dir) or {}
    fingerprint = manifest.get("fingerprint") or {}
    shards = manifest.get("shards") or {}
    shard_count = manifest.get("shard_count")
    states = {str(index): entry.get("state") for index, entry in sorted(shards.items())}
    complete = bool(shard_count) and len(shards) == shard_count and all(s == "complete" for s in states.values())
    return {
        "path": str(output_dir.resolve()),
        "fingerprint_sha256": manifest.get("fingerprint_sha256"),
        "turns": fingerprint.get("turns", "last"),  # generation.turns: `all` for regenerated conversations
        "preset": fingerprint.get("preset"),  # the model family: what the supervision summary is read against
        "shard_count": shard_count,
        "complete": complete,
        "shards": {
            index: {"state": entry.get("state"), "parquet_sha256": entry.get("parquet_sha256")}
            for index, entry in sorted(shards.items())
        },
    }


@dataclass
class ExportTally:
    records_read: int = 0
    rows_written: int = 0
    tokens_written: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    supervised_tokens: int = 0
    rows_unfinished: int = 0
    rows_over_length_kept: int = 0
    roundtrip_failed: int = 0
    conversations_read: int = 0
    conversation_spans_verbatim: int = 0
    conversation_spans_rerendered: int = 0
    generated_tokens: int = 0
    """The output_ids of every record read (reasoning, answer and stop token): what the model generated."""
    history_answers: int = 0
    """The text format without --last-turn-only, a regenerated run: earlier answers the rows' text holds (mask 0
    in the token formats), which a trainer supervising every assistant turn of a text trains on again."""
    turns_not_generated: Counter[str] = field(default_factory=Counter)
    """A regenerated run's planned turns the worker never sent, by cause (rejects.jsonl): in no format's rows."""
    left_out: Counter[str] = field(default_factory=Counter)
    left_out_examples: dict[str, list[str]] = field(default_factory=dict)
    unsupervised: Counter[str] = field(default_factory=Counter)
    """Generated tokens not supervised, by reason: a left_out reason, `rerendered_span` (an earlier answer a
    whole-conversation row holds re-rendered) or `roundtrip_failed` (a text row that re-encodes to other ids)."""

    def leave_out(self, reason: str, name: str, generated: int = 0) -> None:
        """`name`: what was left out, `id#sample` (a conversation, or a record of one answer per line) or
        `id#sample@turn` (a turn of a regenerated conversation), as rejects.jsonl names them. `generated`: the
        output tokens of its records, which no row then supervises."""
        self.left_out[reason] += 1
        self.not_supervised(reason, generated)
        examples = self.left_out_examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(name)

    def not_supervised(self, reason: str, generated: int) -> None:
        if generated:
            self.unsupervised[reason] += generated

    def counts(self, *, conversations: bool = False, spans: bool = False) -> dict[str, int]:
        """`conversations`: whole conversations were exported; `spans`: as token rows (--rows conversations)."""
        counts = {
            "records_read": self.records_read,
            "rows_written": self.rows_written,
            "tokens_written": self.tokens_written,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "supervised_tokens": self.supervised_tokens,
            "generated_tokens": self.generated_tokens,
            "rows_unfinished": self.rows_unfinished,
            "rows_over_length_kept": self.rows_over_length_kept,
            "left_out": sum(self.left_out.values()),
        }
        if conversations:
            counts["conversations_read"] = self.conversations_read
        if spans:
            counts["conversation_spans_verbatim"] = self.conversation_spans_verbatim
            counts["conversation_spans_rerendered"] = self.conversation_spans_rerendered
        return counts


def record_name(prompt_id: str, sample: int, turn: int, *, turns_all: bool) -> str:
    """A record as rejects.jsonl names it: `id#sample`, with `@turn` in an output of regenerated conversations."""
    return f"{prompt_id}#{sample}@{turn}" if turns_all else f"{prompt_id}#{sample}"


def build_manifest(
    *,
    export_format: str,
    source: dict[str, Any],
    options: dict[str, Any],
    tally: ExportTally,
    parts: list[dict[str, Any]],
    token_freq: dict[str, Any],
) -> dict[str, Any]:
    conversations = options.get("rows") == "conversations"  # whole conversations: token rows or (format) text
    spans = conversations and export_format != "conversations"
    manifest: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "export_format": export_format,
        "lossy": export_format in ("text", "conversations"),
        "created_at": time.time(),
        "source": source,
        "options": options,
        "loss": LOSS_CONVERSATIONS if spans else LOSS_TURNS,
        "counts": tally.counts(conversations=conversations, spans=spans),
        "supervision": supervision(
            export_format,
            "conversations" if conversations else "turns",
            tally,
            last_turn_only=bool(options.get("last_turn_only")),
        ),
        "left_out": dict(sorted(tally.left_out.items())),
        "left_out_examples": dict(sorted(tally.left_out_examples.items())),
        "parts": parts,
        "token_freq": token_freq,
    }
    if export_format == "text":
        manifest["lossy_note"] = LOSSY_NOTE
        manifest["counts"]["roundtrip_failed"] = tally.roundtrip_failed
    elif export_format == "conversations":
        manifest["lossy_note"] = CONVERSATIONS_NOTE
        manifest["loss"] = "the trainer's own: every assistant message is the model's answer"
    return manifest


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / MANIFEST_NAME
    write_atomic(path, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return path


def read_export_manifest(directory: str | Path) -> dict[str, Any]:
    manifest: dict[str, Any] = orjson.loads((Path(directory) / MANIFEST_NAME).read_bytes())
    return manifest
