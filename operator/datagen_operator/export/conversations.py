"""Whole regenerated conversations (`generation.turns: all`) for training: which conversations are whole, the
row of one with the loss over every answer it holds verbatim, and the conversation as text. Pure: the shapes of
stored records in, verdicts and rows out; `run.py` reads and writes.

The rules (docs/export.md, "Whole conversations"):

- **Whole.** A conversation (id, sample) is exported whole only when every turn the dataset plans for it
  (`prompts.conversation.plan_turns`) is recorded and no turn carries a check flag. Without the dataset, when its
  turns are recorded from 0 on without a gap, no rejects.jsonl entry names a later turn, and its shard finished
  (a finished worker recorded or cut every planned turn). Otherwise it is left out, counted with its reason.
- **The row** is the conversation's LAST recorded turn's `input_ids + output_ids`, exactly as stored: that
  prompt holds every earlier turn as the chat template rendered it into history.
- **The loss** covers the last turn's completion (its stop token included) and each earlier turn k's answer
  where the row holds it *verbatim*: when the row starts with record k's `input_ids + output_ids`, positions
  [len(input_ids[k]), len(input_ids[k]) + len(output_ids[k])) are exactly the ids the model generated, on
  exactly the context before them. An earlier answer the template rendered otherwise (Qwen3's drops its
  reasoning) is *re-rendered*: never supervised, counted, and handled by `--rerendered-spans`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from datagen_operator.prompts.conversation import AnswerSplit, Message, Turns, turn_messages

ROWS = ("turns", "conversations")
"""--rows: one row per recorded turn (each turn's prompt and completion), or one per whole conversation."""
RERENDERED_POLICIES = ("unmasked", "drop-row")
"""--rerendered-spans: keep a conversation whose row holds an earlier answer re-rendered (that span as context,
mask 0, counted), or leave the conversation out (counted)."""
MESSAGES_KEYS = ("conversations", "messages")
"""The conversations format's list: `conversations` (SpecForge's scripts) or `messages` (TRL, OpenAI)."""

# Why a whole conversation is left out (beside `over_length`): the manifest's left_out keys.
TURNS_CUT = "turns_cut"
"""`turns_cut:<cause>`: the worker ended the conversation before its planned turns (a `turns` entry of
rejects.jsonl: answer_unfinished, answer_called_tool, earlier_turn_refused, unrenderable, too_long)."""
TURN_REFUSED = "turn_refused"
"""The server refused a turn (a `server` entry of rejects.jsonl) and it was never recorded."""
TURNS_MISSING = "turns_missing"
"""A planned turn is not recorded and no rejects.jsonl entry says why (a run not finished)."""
TURNS_NOT_PLANNED = "turns_not_planned"
"""A turn is recorded that the dataset's line does not plan (the dataset is not the run's)."""
TURNS_UNSETTLED = "turns_unsettled"
"""No dataset to count the planned turns, and the conversation's shard did not finish: later turns may come."""
NOT_IN_DATASET = "not_in_dataset"
"""The dataset given holds no line with the conversation's id."""
TURN_FLAG = "turn_flag"
"""`turn_flag:<flag>`: one of its turns carries a check flag (the alphabetically first one named)."""
TRAINER_RERENDERED = "trainer_rerendered"
"""--format conversations: an answer a trainer rendering the rows with the model's chat template does not hold
verbatim (TrainerRenderLoss): its generated tokens are not what that trainer supervises."""
RERENDERED_SPAN = "rerendered_span"
"""--rerendered-spans drop-row: the row holds an earlier answer that is not verbatim."""
NO_ANSWER_SPLIT = "no_answer_split"
"""The conversations format: a turn's record holds no answer split (`answer_content`)."""


def tokens_digest(*parts: np.ndarray) -> bytes:
    """A 128-bit digest of token ids back to back (int32): proves a row starts with a record's tokens
    without holding them."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(np.ascontiguousarray(part, dtype=np.int32).data)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class TurnShape:
    """What a conversation's row needs of one turn's record: where its answer sits in a later prompt, a digest
    of its prompt + answer, its flags, and whether the worker that wrote it finished its shard."""

    prompt_length: int
    completion_length: int
    digest: bytes | None  # of input_ids + output_ids; None where no token row is built (the text format)
    flags: frozenset[str]  # api.flags.effective_flags: `truncated` also when it ended on `length`
    settled: bool  # its shard is complete: every planned turn of the shard was recorded or cut
    unfinished: bool  # read from a segment of a shard not compacted yet


class ConversationIndex:
    """(id, sample) -> turn -> TurnShape over every record of the output (a repeated key keeps its first)."""

    def __init__(self) -> None:
        self.turns: dict[tuple[str, int], dict[int, TurnShape]] = {}
        self._flags: dict[frozenset[str], frozenset[str]] = {}  # one frozenset per combination

    def add(self, prompt_id: str, sample: int, turn: int, shape: TurnShape) -> None:
        flags = self._flags.setdefault(shape.flags, shape.flags)
        if flags is not shape.flags:
            shape = TurnShape(
                shape.prompt_length, shape.completion_length, shape.digest, flags, shape.settled, shape.unfinished
            )
        self.turns.setdefault((prompt_id, sample), {}).setdefault(turn, shape)

    def ids(self) -> set[str]:
        return {prompt_id for prompt_id, _ in self.turns}


def turn_cuts(rejects: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], dict[int, str]]:
    """(id, sample) -> turn -> why it was never sent, from rejects.jsonl (`turns` and `server` entries)."""
    cuts: dict[tuple[str, int], dict[int, str]] = {}
    for entry in rejects:
        prompt_id, kind = entry.get("id"), entry.get("kind")
        if not isinstance(prompt_id, str):
            continue
        key = (prompt_id, int(entry.get("sample") or 0))
        first = int(entry.get("turn") or 0)
        if kind == "turns":
            reason = f"{TURNS_CUT}:{entry.get('cause') or 'unknown'}"
            for turn in range(first, max(int(entry.get("turns") or 0), first + 1)):
                cuts.setdefault(key, {}).setdefault(turn, reason)
        elif kind == "server":
            cuts.setdefault(key, {}).setdefault(first, TURN_REFUSED)
    return cuts


def conversation_verdict(recorded: Mapping[int, TurnShape], planned: int | None, cuts: Mapping[int, str]) -> str | None:
    """Why a conversation is not exported whole, or None when it is (the module docstring's rule). `planned`: the
    turns its dataset line plans (None without the dataset); `cuts`: its turns never sent, with why."""
    last = max(recorded)
    if planned is not None and last >= planned:
        return TURNS_NOT_PLANNED
    expected = range(planned if planned is not None else last + 1)
    missing = next((turn for turn in expected if turn not in recorded), None)
    if missing is not None:
        return cuts.get(missing, TURNS_MISSING)
    if planned is None:
        later = sorted(turn for turn in cuts if turn > last)
        if later:
            return cuts[later[0]]
        if not all(shape.settled for shape in recorded.values()):
            return TURNS_UNSETTLED
    flags = sorted(frozenset().union(*(shape.flags for shape in recorded.values())))
    return f"{TURN_FLAG}:{flags[0]}" if flags else None


@dataclass(frozen=True)
class ConversationRow:
    ids: np.ndarray  # int32: the last turn's input_ids + output_ids
    mask: np.ndarray  # uint8, unshifted: 1 over the last completion and every verbatim earlier answer
    spans_supervised: int  # answers under the loss: the last completion + the verbatim earlier ones
    spans_rerendered: int  # earlier answers the row holds re-rendered: context, mask 0
    tokens_rerendered: int = 0  # the output tokens of those answers (what the model generated, not supervised)


def conversation_row(prompt: np.ndarray, completion: np.ndarray, earlier: Sequence[TurnShape]) -> ConversationRow:
    """The row of a whole conversation from its last turn's tokens and the shapes of its earlier turns (in turn
    order): earlier answer k is supervised iff the row starts with record k's input_ids + output_ids."""
    ids = np.concatenate([prompt, completion]).astype(np.int32, copy=False)
    mask = np.zeros(len(ids), dtype=np.uint8)
    mask[len(prompt) :] = 1
    supervised, rerendered, tokens_rerendered = 1, 0, 0
    for shape in earlier:
        if held_verbatim(ids, shape, within=len(prompt)):
            mask[shape.prompt_length : shape.prompt_length + shape.completion_length] = 1
            supervised += 1
        else:
            rerendered += 1
            tokens_rerendered += shape.completion_length
    return ConversationRow(ids, mask, supervised, rerendered, tokens_rerendered)


def held_verbatim(ids: np.ndarray, shape: TurnShape, *, within: int | None = None) -> bool:
    """Whether `ids` (the first `within` of them) start with the turn's record, `input_ids + output_ids`: then its
    answer sits there exactly as generated, on exactly the context it was generated on."""
    end = shape.prompt_length + shape.completion_length
    limit = len(ids) if within is None else within
    return shape.digest is not None and end <= limit and tokens_digest(ids[:end]) == shape.digest


@dataclass
class TrainerRenderLoss:
    """--format conversations: what a trainer rendering the rows with the model's chat template trains on, measured
    at export (SpecForge's GeneralParser/ThinkingParser and TRL's `messages` render the whole conversation with
    `apply_chat_template(messages, tools=..., add_generation_prompt=False, **chat_template_kwargs)` and tokenize
    the text): an answer is kept when that rendering holds its record verbatim (`held_verbatim`), else lost."""

    answers: int = 0
    answers_lost: int = 0
    tokens: int = 0  # generated tokens of every answer of the exported conversations
    tokens_lost: int = 0  # of those, the tokens of the answers lost
    unrenderable: int = 0  # conversations the template refused to render (every answer counted lost)
    examples: list[str] = field(default_factory=list)

    def add(self, name: str, rendered: np.ndarray | None, shapes: Sequence[TurnShape]) -> int:
        """Count one conversation; returns the generated tokens of its answers lost."""
        lost = [k for k, shape in enumerate(shapes) if rendered is None or not held_verbatim(rendered, shape)]
        self.answers += len(shapes)
        self.answers_lost += len(lost)
        self.tokens += sum(shape.completion_length for shape in shapes)
        self.tokens_lost += sum(shapes[k].completion_length for k in lost)
        self.unrenderable += rendered is None
        if lost and len(self.examples) < 5:
            self.examples.append(f"{name}@{','.join(map(str, lost))}")
        return sum(shapes[k].completion_length for k in lost)

    def to_json(self) -> dict[str, Any]:
        return {
            "answers": self.answers, "answers_lost": self.answers_lost, "tokens": self.tokens,
            "tokens_lost": self.tokens_lost, "unrenderable": self.unrenderable, "examples": self.examples,
        }  # fmt: skip


def conversation_messages(turns: Turns, answers: Sequence[AnswerSplit]) -> list[Message]:
    """The regenerated conversation: the dataset's inputs of each planned turn as planned (system, user, tool
    messages) with the model's answer after each, its reasoning_content included whatever
    generation.historyReasoning sent (the record of what the model wrote, as SpecForge's regenerated files hold
    it; a trainer that re-renders decides what history keeps)."""
    if not answers or len(answers) != len(turns):
        raise ValueError(f"{len(turns)} planned turns, {len(answers)} answers")
    last = len(answers) - 1
    return [*turn_messages(turns, last, answers, history_reasoning="keep"), answers[last].message()]


def conversations_line(
    prompt_id: str,
    sample: int,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: dict[str, Any] | None,
    metadata: dict[str, Any],
    key: str = "conversations",
    fields: str | None = None,
) -> bytes:
    """One JSONL line of the conversations format: `{"id", "sample", <key>: messages, "tools",
    "chat_template_kwargs", "metadata"}` (`tools` null where the line declares none, `chat_template_kwargs` null
    where the prompts were rendered with none: one schema in every row). `chat_template_kwargs`: what the run
    rendered this line's prompts with (its thinking switch and templateVariables, the line's own over them),
    named as SGLang's and vLLM's chat requests and speculators' render client name them: a trainer passes them
    to apply_chat_template, so a line that switched thinking itself is re-rendered as it was generated.
    `fields`: its records' source_fields (JSON text of the dataset line's other fields), `source_fields` last."""
    row = {
        "id": prompt_id, "sample": sample, key: messages, "tools": tools,
        "chat_template_kwargs": chat_template_kwargs, "metadata": metadata,
    }  # fmt: skip
    return orjson.dumps(row)[:-1] + b',"source_fields":' + (fields.encode() if fields else b"null") + b"}\n"
