"""--format conversations: each whole conversation as messages (the dataset's inputs, the model's answers), and what
a template-based trainer that re-renders them loses."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from datagen_operator.export.conversations import (
    NO_ANSWER_SPLIT,
    NOT_IN_DATASET,
    TRAINER_RERENDERED,
    TURNS_MISSING,
    TrainerRenderLoss,
    TurnShape,
    conversation_messages,
    conversations_line,
    tokens_digest,
)
from datagen_operator.export.formats import id_buffers
from datagen_operator.export.manifest import ExportTally
from datagen_operator.export.options import ConversationRender, DatasetSource, ExportOptions, TextCodec
from datagen_operator.export.reader import iter_source_batches, prefetched
from datagen_operator.export.vocab_freq import TokenFrequency
from datagen_operator.export.whole import WholeConversations, whole_conversations
from datagen_operator.export.writer import JsonlParts

if TYPE_CHECKING:
    from datagen_operator.prompts.conversation import AnswerSplit

ANSWER_BUDGET_BYTES = 256 * 1024 * 1024
"""The conversations format holds answers (their text) up to about this much before it writes the conversations
they complete, reading the dataset once per such round."""


def conversation_texts(
    output_dir: Path,
    source: dict[str, Any],
    options: ExportOptions,
    parts: JsonlParts,
    tally: ExportTally,
    frequency: TokenFrequency,
    codec: TextCodec | None,
) -> TrainerRenderLoss | None:
    """--format conversations: each whole conversation as messages (the dataset's inputs as planned, the model's
    answers as the next turn's history held them), in dataset order. With a codec that renders, what a
    template-based trainer loses of them is measured (None without)."""
    from datagen_operator.output.manifest import read_manifest
    from datagen_operator.prompts.render import fingerprint_template_kwargs

    dataset = options.dataset
    assert dataset is not None
    # What the run rendered every prompt with: each row carries it, its line's own kwargs over it.
    run_kwargs = fingerprint_template_kwargs((read_manifest(output_dir) or {}).get("fingerprint") or {})
    whole = whole_conversations(output_dir, source, options, tally, digests=False)
    render = codec.render_conversation if codec is not None else None
    loss = TrainerRenderLoss() if render is not None else None
    pending = _PendingAnswers(whole)
    columns = (*ANSWER_READ, "input_ids") if render is not None else ANSWER_READ
    for batch in prefetched(iter_source_batches(output_dir, options.batch_tokens, columns)):
        records = batch.records
        prompt_ids, samples = records.column("id").to_pylist(), records.column("sample").to_pylist()
        turns = records.column("turn").fill_null(0).to_pylist()
        contents = records.column("answer_content").to_pylist()
        reasonings = records.column("answer_reasoning").to_pylist()
        calls = records.column("answer_tool_calls").to_pylist()
        fields = records.column("source_fields").to_pylist()
        values, offsets = id_buffers(records.column("output_ids"))
        if render is not None:
            prompt_values, prompt_offsets = id_buffers(records.column("input_ids"))
        for row, key in enumerate(zip(prompt_ids, samples, strict=True)):
            if key in whole and turns[row] <= whole[key][0]:
                completion = values[offsets[row] : offsets[row + 1]]
                frequency.add(np.bincount(completion))
                stored = {"answer_content": contents[row], "answer_reasoning": reasonings[row]}
                stored["answer_tool_calls"] = calls[row]
                pending.add(key, turns[row], stored, len(completion), batch.unfinished, fields[row])
                if render is not None:
                    prompt = prompt_values[prompt_offsets[row] : prompt_offsets[row + 1]]
                    digest = tokens_digest(prompt, completion)
                    shape = TurnShape(len(prompt), len(completion), digest, frozenset(), True, batch.unfinished)
                    pending.shapes.setdefault(key, {})[turns[row]] = shape
        if pending.held >= ANSWER_BUDGET_BYTES:
            _write_conversations(dataset, options, pending, parts, tally, run_kwargs, render, loss)
    _write_conversations(dataset, options, pending, parts, tally, run_kwargs, render, loss)
    for key in pending.answers:  # never all read: cannot happen for a conversation found whole
        tally.leave_out(TURNS_MISSING, f"{key[0]}#{key[1]}", pending.completion_tokens.get(key, 0))
    return loss


ANSWER_READ = (
    "id", "sample", "turn", "output_ids", "answer_content", "answer_reasoning", "answer_tool_calls", "source_fields",
)  # fmt: skip


def _split_size(split: AnswerSplit) -> int:
    """About what an answer holds in memory, in characters."""
    calls = sum(len(call.name) + len(call.arguments) for call in split.tool_calls)
    return len(split.content) + len(split.reasoning_content or "") + calls


class _PendingAnswers:
    """Answers of whole conversations read so far, until their conversation is written."""

    def __init__(self, whole: WholeConversations) -> None:
        self.whole = whole
        self.answers: dict[tuple[str, int], dict[int, AnswerSplit]] = {}
        self.no_split: set[tuple[str, int]] = set()
        self.unfinished: set[tuple[str, int]] = set()
        self.completion_tokens: dict[tuple[str, int], int] = {}
        self.fields: dict[tuple[str, int], str] = {}  # its records' source_fields (every turn's are its line's)
        self.shapes: dict[tuple[str, int], dict[int, TurnShape]] = {}  # with a trainer render to measure against
        self.held = 0

    def add(
        self, key: tuple[str, int], turn: int, stored: dict[str, Any], tokens: int, unfinished: bool, fields: str | None
    ) -> None:
        """`stored`: the record's answer columns (output/records.py `stored_split` reads them)."""
        from datagen_operator.output.records import stored_split

        if stored["answer_content"] is None:
            self.no_split.add(key)
        split = stored_split(stored)
        self.answers.setdefault(key, {})[turn] = split
        self.completion_tokens[key] = self.completion_tokens.get(key, 0) + tokens
        if unfinished:
            self.unfinished.add(key)
        if fields is not None:
            self.fields[key] = fields
        self.held += _split_size(split)

    def ready(self) -> dict[str, list[int]]:
        """id -> samples whose every turn is read."""
        out: dict[str, list[int]] = {}
        for key, got in self.answers.items():
            if len(got) == self.whole[key][0] + 1:
                out.setdefault(key[0], []).append(key[1])
        return out

    def take(self, key: tuple[str, int]) -> tuple[list[AnswerSplit], int, bool, bool, str | None]:
        """Its answers in turn order, completion tokens, whether unfinished, whether a split was missing, and its
        records' source_fields."""
        got = self.answers.pop(key)
        self.held -= sum(_split_size(answer) for answer in got.values())
        split_missing = key in self.no_split
        self.no_split.discard(key)
        unfinished = key in self.unfinished
        self.unfinished.discard(key)
        answers = [got[turn] for turn in sorted(got)]
        return answers, self.completion_tokens.pop(key, 0), unfinished, split_missing, self.fields.pop(key, None)


def _write_conversations(
    dataset: DatasetSource,
    options: ExportOptions,
    pending: _PendingAnswers,
    parts: JsonlParts,
    tally: ExportTally,
    run_kwargs: dict[str, Any],
    render: ConversationRender | None = None,
    loss: TrainerRenderLoss | None = None,
) -> None:
    """Write the conversations whose answers are all read, their inputs read from the dataset (one pass).
    `run_kwargs`: the chat-template keyword arguments of the run (prompts/render.py fingerprint_template_kwargs);
    `render` and `loss`: each conversation rendered as a template-based trainer renders it, its loss counted."""
    from datagen_operator.prompts.conversation import plan_turns
    from datagen_operator.prompts.render import rendered_kwargs

    ready = pending.ready()
    if not ready:
        return
    lines: list[bytes] = []
    found: set[str] = set()
    for prompt in dataset.prompts(set(ready)):
        found.add(prompt.id)
        turns = plan_turns(prompt.messages)
        kwargs = rendered_kwargs(run_kwargs, prompt.variables) or None
        for sample in sorted(ready[prompt.id]):
            answers, completion_tokens, unfinished, split_missing, fields = pending.take((prompt.id, sample))
            shapes = pending.shapes.pop((prompt.id, sample), {})
            name = f"{prompt.id}#{sample}"
            if split_missing:
                tally.leave_out(NO_ANSWER_SPLIT, name, completion_tokens)
                continue
            messages = conversation_messages(turns, answers)
            lost = 0
            if render is not None and loss is not None:
                try:
                    rendered: np.ndarray | None = np.asarray(render(messages, prompt.tools, kwargs), dtype=np.int32)
                except Exception:  # a template that refuses the conversation: nothing of it is trained on as written
                    rendered = None
                lost = loss.add(name, rendered, [shapes[turn] for turn in sorted(shapes)])
            metadata = {"turns": len(answers), "completion_tokens": completion_tokens, "unfinished": unfinished}
            lines.append(
                conversations_line(
                    prompt.id, sample, messages, prompt.tools, kwargs, metadata, options.messages_key, fields
                )
            )
            tally.rows_written += 1
            tally.completion_tokens += completion_tokens
            # Every answer is an assistant message (manifest.SUPERVISED_MEANS); where a trainer's render was
            # measured, the answers it does not hold verbatim are not what it supervises.
            tally.supervised_tokens += completion_tokens - lost
            if lost:
                tally.unsupervised[TRAINER_RERENDERED] += lost
            tally.rows_unfinished += unfinished
    for prompt_id in set(ready) - found:  # the dataset lost the line since its planned turns were read
        for sample in ready[prompt_id]:
            _, completion_tokens, _, _, _ = pending.take((prompt_id, sample))
            tally.leave_out(NOT_IN_DATASET, f"{prompt_id}#{sample}", completion_tokens)
            pending.shapes.pop((prompt_id, sample), None)
    parts.write_lines(lines, 0)
