"""A conversation regenerated turn by turn (`generation.turns: all`) and the one answer of `turns: last`.

The rules, pure over a dataset line's (normalised) messages:

- `turns: all`. The dataset's assistant messages are never sent. Every other message is an input; the inputs up
  to each assistant slot that hold a user message are one turn (two user messages in a row are answered once,
  as a chat client would send them). System messages stay where they are. Turn k's prompt is the inputs of turns
  0..k with the model's own answers to turns 0..k-1 in between (each with or without its reasoning, below),
  rendered by the model's chat template.
- Tool results answer the *dataset's* assistant's tool calls, not the regenerated answer's: a conversation is
  regenerated up to its first `tool` message; the user turns from there on are not planned (`TOOL_TURN`,
  counted). An answer that itself calls a tool (the line declares tools and SGLang's tool-call parser finds a call's
  opener in it, harmony's `commentary to=functions.X` message included, or it ended with gpt-oss's `<|call|>`) ends
  the conversation too (`ANSWER_CALLED_TOOL`): no dataset tool result answers it.
- An answer that did not end with a stop (cut at max_new_tokens, aborted) ends the conversation
  (`ANSWER_UNFINISHED`): its half-written text is no history a client would send.
- `turns: last`. One answer per line, to its last user turn: trailing assistant messages are dropped (a ShareGPT
  line ends with the dataset's answer; the model writes that answer again, never a second one in a row).

What history a request sends is the client's choice, generation.historyReasoning (`client_messages`, the one rule
every render of a request goes through): `keep` sends each earlier assistant message with its reasoning_content,
as SGLang's chat endpoint returned it (SGLang hands an assistant message's reasoning_content to the chat template
as it came: serving_chat `_apply_jinja_template`), so the model's own template decides what earlier reasoning the
prompt holds; `drop` removes it first, as SpecForge's `regenerate_train_data.py` does before every request.

How an answer becomes history is what SGLang's chat endpoint hands a client (`split_answer`): the output ids with
the matched stop id trimmed (the detokenizer's `trim_matched_stop`, which keeps gpt-oss's `<|call|>` under the
gpt-oss tool parser), decoded with special tokens skipped unless the request has tools or the model speaks harmony
(serving_chat), split by the run's reasoning parser (`engine/reasoning.py`), then, when the line declares tools,
by its tool-call parser (`engine/tool_calls.py`): the content is the parser's normal text and the calls are kept
apart. Both are held to SGLang's own parsers by tests/contract. The split is stored with each turn's record, so
verify rebuilds every prompt from the run's own answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from datagen_operator.api.generation_spec import HistoryReasoning
from datagen_operator.engine.chat_content import message_text
from datagen_operator.engine.reasoning import DETECTORS, HARMONY_PARSER, force_reasoning, split_reasoning
from datagen_operator.engine.tool_calls import TOOL_CALL_PARSERS, ParsedCall, read_tool_calls, stop_kept

Message = dict[str, Any]
HISTORY_REASONING: tuple[HistoryReasoning, ...] = get_args(HistoryReasoning)

# Why turns of a conversation are not generated (the `cause` of their rejects.jsonl entry).
TOOL_TURN = "tool_turn"
ANSWER_CALLED_TOOL = "answer_called_tool"
ANSWER_UNFINISHED = "answer_unfinished"
EARLIER_TURN_REFUSED = "earlier_turn_refused"
"""The server refused (4xx) an earlier turn, or its prompt could not be rendered or was too long."""
NO_USER_TURN = "no_user_turn"
TURN_CAUSES = (TOOL_TURN, ANSWER_CALLED_TOOL, ANSWER_UNFINISHED, EARLIER_TURN_REFUSED)


@dataclass(frozen=True, slots=True)
class Turns:
    """A conversation cut into the inputs of the answers to generate."""

    inputs: tuple[tuple[Message, ...], ...]
    """Per planned turn: the messages before its answer (since the previous answer)."""
    cut: int = 0
    """User turns not planned: from the first tool message on (TOOL_TURN)."""

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def records(self) -> int:
        """The records each sample of its line counts in the run's plan: one per planned turn, and one for a line
        with none (set aside: no user turn to answer)."""
        return max(1, len(self.inputs))


def _has_user(messages: Sequence[Message]) -> bool:
    return any(message.get("role") == "user" for message in messages)


def plan_turns(messages: Sequence[Message]) -> Turns:
    """The turns `turns: all` generates for a conversation (see the module docstring)."""
    inputs: list[tuple[Message, ...]] = []
    pending: list[Message] = []
    for at, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            rest = [*pending, *messages[at:]]
            cut = sum(1 for m in rest if m.get("role") == "user")
            return Turns(tuple(inputs), cut)
        if role == "assistant":
            if _has_user(pending):
                inputs.append(tuple(pending))
                pending = []
            continue  # an assistant message before any user one is dropped with the others
        pending.append(message)
    if _has_user(pending):
        inputs.append(tuple(pending))
    return Turns(tuple(inputs))


def planned_turns(messages: Sequence[Message], turns: str) -> int:
    """How many answers a line gets: one with `turns: last`, one per planned turn with `all`."""
    return len(plan_turns(messages)) if turns == "all" else 1


def last_turn(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """`turns: last`: the messages with trailing assistant messages dropped, and how many were."""
    end = len(messages)
    while end and messages[end - 1].get("role") == "assistant":
        end -= 1
    return list(messages[:end]), len(messages) - end


@dataclass(frozen=True, slots=True)
class AnswerSplit:
    """An answer as SGLang's chat endpoint gives it to a client: what the next turn's history holds."""

    content: str
    reasoning_content: str | None
    tool_calls: tuple[ParsedCall, ...] = ()
    """The calls SGLang's tool-call parser returns for the answer (name, arguments as its JSON string)."""
    calls_tool: bool = field(default=False, compare=False)
    """The answer holds a tool call: the parser found a call's opener in it (SGLang's `has_tool_call`; no call may
    parse from it: an undeclared tool, arguments that are no JSON), or it ended with the stop id that ends a call
    (gpt-oss's `<|call|>`). It ends its conversation (ANSWER_CALLED_TOOL), so it is never history. Not stored: a
    split read back from the store calls a tool when it holds calls."""

    def message(self) -> Message:
        """The assistant message a chat client sends back with the next turn (and the conversations export
        writes): its calls as SGLang returns them where it made any (such an answer ends its conversation, so
        only the export meets them)."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [call.as_message() for call in self.tool_calls]
        return message


def dataset_answers(messages: Sequence[Message], turns: Turns) -> list[AnswerSplit]:
    """The dataset's own answer after each planned turn (empty where it has none): stand-ins for the model's, for
    the preflight to estimate how long a conversation's later prompts grow before any answer exists."""
    answers: list[AnswerSplit] = []
    at = 0
    for inputs in turns.inputs:
        at = next(k for k in range(at, len(messages)) if messages[k] is inputs[-1]) + 1
        following = messages[at] if at < len(messages) else None
        if following is not None and following.get("role") == "assistant":
            reasoning = following.get("reasoning_content")
            # Text parts as one string: a stand-in answer for the prompt's length only.
            answers.append(AnswerSplit(message_text(following), reasoning if isinstance(reasoning, str) else None))
        else:
            answers.append(AnswerSplit("", None))
    return answers


def client_messages(messages: Sequence[Message], history_reasoning: HistoryReasoning) -> list[Message]:
    """A request's messages as the chat client sends them (generation.historyReasoning): with `keep` as they are,
    with `drop` every assistant message without its reasoning_content (SpecForge's `build_query_kwargs`). The
    one rule of what history holds: every render of a request (worker, canary, preflight, verify) passes here."""
    if history_reasoning not in HISTORY_REASONING:
        raise ValueError(f"generation.historyReasoning must be one of {', '.join(HISTORY_REASONING)}")
    if history_reasoning == "keep":
        return list(messages)
    return [
        {key: value for key, value in message.items() if key != "reasoning_content"}
        if message.get("role") == "assistant" and "reasoning_content" in message
        else message
        for message in messages
    ]


def turn_messages(
    turns: Turns, turn: int, answers: Sequence[AnswerSplit], *, history_reasoning: HistoryReasoning
) -> list[Message]:
    """Turn `turn`'s prompt messages: the inputs of turns 0..turn with the answers to 0..turn-1 in between, as
    the client sends them (`client_messages`)."""
    if not 0 <= turn < len(turns.inputs) or len(answers) < turn:
        raise ValueError(f"turn {turn} of {len(turns.inputs)} needs {turn} earlier answers, got {len(answers)}")
    out: list[Message] = []
    for k in range(turn + 1):
        out.extend(turns.inputs[k])
        if k < turn:
            out.append(answers[k].message())
    return client_messages(out, history_reasoning)


def request_messages(
    messages: Sequence[Message],
    turns: str,
    turn: int = 0,
    answers: Sequence[AnswerSplit] = (),
    *,
    history_reasoning: HistoryReasoning,
) -> list[Message]:
    """The messages a line's request `turn` renders: the worker's, the canary's, the preflight's and verify's."""
    if turns == "all":
        return turn_messages(plan_turns(messages), turn, answers, history_reasoning=history_reasoning)
    return client_messages(last_turn(messages)[0], history_reasoning)


def finished_with_stop(finish_reason: Any) -> bool:
    return isinstance(finish_reason, Mapping) and finish_reason.get("type") == "stop"


def calls_tool(split: AnswerSplit) -> bool:
    """Whether the answer calls a tool (AnswerSplit.calls_tool), or holds calls (a split read back)."""
    return split.calls_tool or bool(split.tool_calls)


class AnswerSplitter:
    """`split_answer` for one run: its tokenizer, reasoning parser, template and template variables."""

    def __init__(
        self,
        tokenizer: Any,
        reasoning_parser: str | None,
        chat_template: str | None,
        variables: Mapping[str, Any],
        tool_call_parser: str | None = None,
    ) -> None:
        if reasoning_parser is not None and reasoning_parser not in DETECTORS:
            raise ValueError(
                f"reasoning parser {reasoning_parser!r}: how it splits an answer is not modelled here "
                f"({', '.join(sorted(DETECTORS))} are), so the history of a later turn cannot be built as SGLang's "
                "chat endpoint would; use generation.turns: last"
            )
        if tool_call_parser is not None and tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool-call parser {tool_call_parser!r}: how it reads a call is not modelled here "
                f"({', '.join(sorted(TOOL_CALL_PARSERS))} are), so an answer that calls a tool cannot be told from "
                "one that does not as SGLang's chat endpoint tells them; use generation.turns: last, or "
                "server.toolCallParser: none when no line declares tools"
            )
        self.tokenizer = tokenizer
        self.parser = reasoning_parser
        self.tool_call_parser = tool_call_parser
        self.chat_template = chat_template
        self.variables = variables
        # serving_chat decides once per request whether the output starts inside reasoning: from the template
        # and the request's template variables, here the run's (a line's own are decided per answer).
        self.forced = self._forced(variables)

    def _forced(self, variables: Mapping[str, Any]) -> bool:
        return force_reasoning(self.parser, self.chat_template, variables) if self.parser else False

    def split(
        self,
        output_ids: Sequence[int],
        finish_reason: Any,
        has_tools: bool,
        line_variables: Mapping[str, Any] | None = None,
        tools: Sequence[Any] = (),
    ) -> AnswerSplit:
        """`line_variables`: the line's own chat_template_kwargs, over the run's; `tools`: the line's tools (the
        tool-call parser drops calls to undeclared ones)."""
        ids = list(output_ids)
        matched = finish_reason.get("matched") if isinstance(finish_reason, Mapping) else None
        stopped = finished_with_stop(finish_reason) and isinstance(matched, int) and ids and ids[-1] == matched
        ended_call = stopped and stop_kept(self.tool_call_parser, ids[-1])
        if stopped and not ended_call:
            ids.pop()  # the matched stop id is trimmed before decoding (no_stop_trim is never sent)
        keep_special = has_tools or self.parser == HARMONY_PARSER
        text = self.tokenizer.decode(ids, skip_special_tokens=not keep_special)
        forced = self._forced({**self.variables, **line_variables}) if line_variables else self.forced
        split = split_reasoning(text, self.parser, forced)
        content, found = split.content, False
        calls: tuple[ParsedCall, ...] = ()
        if has_tools:
            parsed = read_tool_calls(self.tool_call_parser, content, tools)
            content, calls, found = parsed.normal_text, tuple(parsed.calls), parsed.found
        return AnswerSplit(content, split.reasoning, calls, calls_tool=bool(found or ended_call))
