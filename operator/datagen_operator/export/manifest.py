"""The export's own manifest (`export-manifest.json`): where the data came from, what went out, what
was left out and why. Written last: its presence means the export finished."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

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
    left_out: Counter[str] = field(default_factory=Counter)
    left_out_examples: dict[str, list[str]] = field(default_factory=dict)

    def leave_out(self, reason: str, name: str) -> None:
        """`name`: what was left out, `id#sample` (a conversation, or a record of one answer per line) or
        `id#sample@turn` (a turn of a regenerated conversation), as rejects.jsonl names them."""
        self.left_out[reason] += 1
        examples = self.left_out_examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(name)

    def counts(self, *, conversations: bool = False, spans: bool = False) -> dict[str, int]:
        """`conversations`: whole conversations were exported; `spans`: as token rows (--rows conversations)."""
        counts = {
            "records_read": self.records_read,
            "rows_written": self.rows_written,
            "tokens_written": self.tokens_written,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "supervised_tokens": self.supervised_tokens,
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
