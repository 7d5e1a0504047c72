"""generation.turns all against the SGLang simulator: every user turn answered in order on the model's own earlier
answers, one record per (id, sample, turn); the rules that end a conversation early, counted; kill -9 at any point
resumes each conversation from its last recorded turn, every (id, sample, turn) exactly once."""

from __future__ import annotations

import itertools
import json
import random
import signal
import time
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pytest

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.api.spec import API_GROUP_VERSION
from datagen_operator.engine.tool_calls import GPT_OSS_CALL_ID
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.readers import iter_records, iter_rejects
from datagen_operator.output.records import stored_split
from datagen_operator.prompts.conversation import AnswerSplit, AnswerSplitter, plan_turns, turn_messages
from datagen_operator.prompts.lines import Prompt
from datagen_operator.prompts.render import load_tokenizer
from datagen_operator.steps.verify import verify_output
from tests.harness.processes import wait_until
from tests.harness.sim import start_sim
from tests.manifests import local_spec
from tests.worker.simrun import (
    SIM_FLAGS,
    TOOLS,
    progress,
    reference_renderer,
    run_inprocess,
    spawn,
    spec,
    standin,
    write_dataset,
)

ORIGINAL = "ORIGINAL-ANSWER"
"""Text of the dataset's own assistant turns: it must reach no prompt."""
PACED = ("--sim-speed", "gpu", "--sim-ttft-s", "0.01", "--sim-batch-capacity", "256", "--sim-tokens-per-s", "300")


def conversations(count: int, *, turns_of: Any = None) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        user_turns = turns_of(i) if turns_of else 2 + i % 3
        messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}] if i % 4 == 0 else []
        for t in range(user_turns):
            messages.append({"role": "user", "content": f"conversation {i} question {t + 1}?"})
            messages.append({"role": "assistant", "content": f"{ORIGINAL} {i}.{t}"})
        out.append({"id": f"c{i:04d}", "messages": messages})
    return out


@cache
def _splitter() -> AnswerSplitter:
    renderer = reference_renderer()
    return AnswerSplitter(renderer.tokenizer, "kimi_k2", renderer.chat_template, {"thinking": True}, "kimi_k2")


def by_conversation(output: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for record in iter_records(output):
        found.setdefault((record["id"], record["sample"]), []).append(record)
    for records in found.values():
        records.sort(key=lambda record: record["turn"])
    return found


def check_conversations(output: Path, items: list[dict[str, Any]], samples: int = 1) -> int:
    """Every planned turn recorded exactly once, in order, each prompt the template's rendering of the dataset's
    user turns with the run's own recorded answers, each recorded split the split of its output ids."""
    renderer, splitter = reference_renderer(), _splitter()
    keys = Counter((r["id"], r["sample"], r["turn"]) for r in iter_records(output))
    assert not [k for k, n in keys.items() if n > 1], "duplicates"
    wanted = {
        (item["id"], s, t) for item in items for s in range(samples) for t in range(len(plan_turns(item["messages"])))
    }
    assert set(keys) == wanted, f"missing {sorted(wanted - set(keys))[:5]}, extra {sorted(set(keys) - wanted)[:5]}"
    messages = {item["id"]: item for item in items}
    for (prompt_id, _), records in by_conversation(output).items():
        item = messages[prompt_id]
        turns = plan_turns(item["messages"])
        answers: list[AnswerSplit] = []
        for record in records:
            assert record["turn"] == len(answers)
            expected = renderer.reference(
                turn_messages(turns, record["turn"], answers, history_reasoning="keep"), item.get("tools")
            )
            assert record["input_ids"] == expected, f"{prompt_id} turn {record['turn']}"
            assert ORIGINAL not in renderer.tokenizer.decode(record["input_ids"])
            tools = item.get("tools") or ()
            split = splitter.split(record["output_ids"], record["finish_reason"], bool(tools), None, tools)
            assert stored_split(record) == split
            assert record["finish_reason"]["type"] == "stop"
            answers.append(split)
    return sum(keys.values())


def test_every_user_turn_is_answered_in_order_on_the_models_own_answers(tmp_path: Path) -> None:
    items = conversations(12)
    output = tmp_path / "out"
    document = spec(write_dataset(tmp_path / "chats.jsonl", items), output, **{"generation.turns": "all"})
    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as server:
        assert run_inprocess(document, [server.url]) == EXIT_OK
    made = check_conversations(output, items)
    assert made == sum(2 + i % 3 for i in range(12)) == 36
    # A later turn's prompt holds the earlier answer's content (kimi-k2.5's template keeps it in history).
    first = by_conversation(output)[("c0001", 0)]
    decode = reference_renderer().tokenizer.decode
    assert first[0]["answer_content"].strip() and first[0]["answer_content"].strip() in decode(first[1]["input_ids"])
    state = progress(output)
    assert (state["state"], state["records_done"], state["records_total"]) == ("complete", 36, 36)
    assert (state["prompts_done"], state["prompts_total"]) == (12, 12)
    assert state["records_by_turn"] == {"0": 12, "1": 12, "2": 8, "3": 4}  # 2 + i % 3 user turns
    report = verify_output(output, _spec_model(document), tokenizer=reference_renderer().tokenizer)
    fidelity = next(check for check in report.checks if check.name == "prompt_fidelity")
    assert report.passed and fidelity.total == 36, fidelity.verdict


def test_each_conversation_stays_on_one_of_two_servers_which_finds_its_history_cached(tmp_path: Path) -> None:
    """Each turn goes to the server that answered the turn before (engine/client/pool.py), whose radix cache holds
    that turn's prompt and answer: every later turn reports at least the previous prompt as `cached_tokens`.
    Three lanes: with at most three requests in flight no server ever holds PINNED_LOAD_CAP times the mean, so no
    conversation may leave its server for load (with eight, one did, once, in a full suite under load); picking the
    least loaded server for every turn moved turns in 4 runs of 4."""
    items = conversations(16, turns_of=lambda i: 3)
    output = tmp_path / "out"
    changes = {"generation.turns": "all", "clients.concurrency": 3}
    document = spec(write_dataset(tmp_path / "chats.jsonl", items), output, **changes)
    with (
        start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as first,
        start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as second,
    ):
        assert run_inprocess(document, [first.url, second.url]) == EXIT_OK
    check_conversations(output, items)
    conversations_by_server: Counter[str] = Counter()
    for key, records in by_conversation(output).items():
        assert len({record["server"] for record in records}) == 1, f"{key} moved between servers"
        conversations_by_server[records[0]["server"]] += 1
        for before, after in itertools.pairwise(records):
            assert after["cached_tokens"] >= len(before["input_ids"]), f"{key} turn {after['turn']}"
    assert sorted(conversations_by_server) == sorted([first.url, second.url])


def _spec_model(document: dict[str, Any]) -> Any:
    from datagen_operator.api import parse_run

    return parse_run(
        {"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun", "metadata": {"name": "t"}, "spec": document}
    ).spec


def test_a_conversation_ends_at_its_first_tool_message_and_at_an_unfinished_answer(tmp_path: Path) -> None:
    tool_line = {
        "id": "tools",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call_0",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": '{"forecast": "rain"}'},
            {"role": "assistant", "content": f"{ORIGINAL} rain"},
            {"role": "user", "content": "and Madrid?"},
            {"role": "user", "content": "and Rome?"},
        ],
    }  # fmt: skip
    items = [*conversations(3), tool_line]
    output = tmp_path / "out"
    # Answers of ~40 tokens against max_new_tokens 40: some turn 1 answers are cut, which ends their conversation.
    document = spec(
        write_dataset(tmp_path / "chats.jsonl", items),
        output,
        **{
            "generation.turns": "all",
            "generation.sampling": {"max_new_tokens": 40, "temperature": 0.6, "sampling_seed": 0},
        },
    )
    # Seeded under deterministic inference, as SGLang reproduces answers: the same cut answers each time.
    with start_sim(
        *SIM_FLAGS, "--sim-seed", "11", "--enable-deterministic-inference", tokenizer_dir=standin()
    ) as server:
        assert run_inprocess(document, [server.url]) == EXIT_OK
    records = list(iter_records(output))
    assert {r["turn"] for r in records if r["id"] == "tools"} == {0}  # one turn before the tool message
    cut = [entry for entry in iter_rejects(output) if entry.get("kind") == "turns"]
    unfinished = [r for r in records if r["finish_reason"]["type"] != "stop"]
    ended = {
        (r["id"], r["sample"], r["turn"] + 1)
        for r in unfinished
        if r["turn"] + 1 < len(plan_turns(_items(items)[r["id"]]))
    }
    assert {(e["id"], e["sample"], e["turn"]) for e in cut} == ended and ended, (
        "an unfinished answer ends its conversation"
    )
    assert {e["cause"] for e in cut} == {"answer_unfinished"}
    assert not [r for r in records if (r["id"], r["sample"], r["turn"]) in ended]
    state = progress(output)
    assert state["turns_cut"]["tool_turn"] == 2  # "and Madrid?" and "and Rome?" are one turn each side of nothing
    assert state["turns_cut"]["answer_unfinished"] == sum(e["turns"] - e["turn"] for e in cut)
    assert state["records_done"] + state["records_set_aside"] == state["records_total"]
    report = verify_output(output, _spec_model(document), tokenizer=reference_renderer().tokenizer)
    completeness = next(check for check in report.checks if check.name == "completeness")
    assert completeness.passed, completeness.verdict
    turns_not_sent = sum(e["turns"] - e["turn"] for e in cut)
    assert f"turns not sent: {turns_not_sent} answer_unfinished" in completeness.verdict
    # Reported turn by turn and conversation by conversation.
    reported = next(check for check in report.checks if check.name == "conversations")
    by_turn = Counter(r["turn"] for r in records)
    assert f"{len(items) - len({(e['id'], e['sample']) for e in cut})}/{len(items)} conversations" in reported.verdict
    assert f"records by turn: 1: {by_turn[0]}" in reported.verdict
    assert f"{len(cut)} ended early" in reported.verdict


def _items(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {item["id"]: item["messages"] for item in items}


def raw_turn_keys(output: Path) -> Counter[tuple[str, int, int]]:
    counts: Counter[tuple[str, int, int]] = Counter()
    for segment in OutputLayout(output).segments(0):
        for line in segment.read_bytes().splitlines():
            record = orjson.loads(line)
            counts[(record["id"], record["sample"], record["turn"])] += 1
    return counts


def test_kill_9_mid_conversation_resumes_each_from_its_last_recorded_turn(tmp_path: Path) -> None:
    rng = random.Random(30)
    items = conversations(40, turns_of=lambda i: 3 + i % 3)
    planned = sum(3 + i % 3 for i in range(40)) * 2
    output = tmp_path / "out"
    document = spec(
        write_dataset(tmp_path / "chats.jsonl", items),
        output,
        **{"generation.turns": "all", "generation.samplesPerPrompt": 2, "clients.concurrency": 12},
    )
    log = tmp_path / "worker.log"
    mid_conversation = 0
    with start_sim(*SIM_FLAGS, *PACED, tokenizer_dir=standin()) as server:
        for _ in range(5):
            before = sum(raw_turn_keys(output).values()) if OutputLayout(output).shard_dir(0).is_dir() else 0
            worker = spawn(document, [server.url], "--render-processes", "0", "--no-compact", log=log)
            try:
                wait_until(
                    lambda: OutputLayout(output).shard_dir(0).is_dir() and sum(raw_turn_keys(output).values()) > before,  # noqa: B023
                    timeout=60, describe="a new turn", watched=[worker], interval=0.01,
                )  # fmt: skip
                time.sleep(rng.uniform(0.1, 0.6))
                assert worker.poll() is None, "the run finished before it was killed"
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait(10)
            keys = raw_turn_keys(output)
            turns_done = Counter((prompt_id, sample) for prompt_id, sample, _ in keys)
            plan = {item["id"]: len(plan_turns(item["messages"])) for item in items}
            mid_conversation += sum(1 for (prompt_id, _), done in turns_done.items() if 0 < done < plan[prompt_id])
        assert 0 < sum(raw_turn_keys(output).values()) < planned
        assert mid_conversation, "no kill left a conversation mid-way: the resume path went untested"
        assert run_inprocess(document, [server.url], "--no-compact") == EXIT_OK
        counts = raw_turn_keys(output)
        assert [key for key, n in counts.items() if n > 1] == [] and len(counts) == planned
        assert run_inprocess(document, [server.url]) == EXIT_OK  # compaction only
    check_conversations(output, items, samples=2)
    assert "resuming" in log.read_text() or mid_conversation
    state = progress(output)
    assert (state["state"], state["records_done"], state["records_total"]) == ("complete", planned, planned)


def test_a_prompt_object_in_the_plan_is_normalised_before_turns_are_planned() -> None:
    prompt = Prompt(0, "x", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], None)
    assert len(plan_turns(prompt.messages)) == 1


def test_a_refused_turn_ends_its_conversation_and_a_crash_before_the_cut_is_repaired(tmp_path: Path) -> None:
    items = conversations(16, turns_of=lambda i: 3)
    output = tmp_path / "out"
    document = spec(write_dataset(tmp_path / "chats.jsonl", items), output, **{"generation.turns": "all"})
    refuse = ("--sim-fault-5xx-rate", "0.25", "--sim-fault-5xx-status", "400", "--sim-seed", "4")
    with start_sim(*SIM_FLAGS, *refuse, tokenizer_dir=standin()) as server:
        assert run_inprocess(document, [server.url], "--no-compact") == EXIT_OK
        rejects = list(iter_rejects(output))
        refused = {(e["id"], e["sample"], e["turn"]) for e in rejects if e.get("kind") == "server"}
        cut = {(e["id"], e["sample"], e["turn"]) for e in rejects if e.get("kind") == "turns"}
        assert cut == {(i, s, t + 1) for i, s, t in refused if t + 1 < 3} and cut, "a refusal ends its conversation"
        assert {e["cause"] for e in rejects if e.get("kind") == "turns"} == {"earlier_turn_refused"}
        # A crash between the refusal's entry and the cut's: the next start writes the cut, sends nothing after it.
        path = OutputLayout(output).rejects(0)
        kept = [line for line in path.read_bytes().splitlines(keepends=True) if b'"kind":"turns"' not in line]
        path.write_bytes(b"".join(kept))
        before = sum(raw_turn_keys(output).values())
        assert run_inprocess(document, [server.url]) == EXIT_OK
    again = {(e["id"], e["sample"], e["turn"]) for e in iter_rejects(output) if e.get("kind") == "turns"}
    assert again == cut
    records = list(iter_records(output))
    assert len(records) == before and not [r for r in records if (r["id"], r["sample"], r["turn"]) in cut]
    state = progress(output)
    assert (
        state["records_done"] + state["records_rejected"] + state["records_set_aside"] == state["records_total"] == 48
    )
    report = verify_output(output, _spec_model(document), tokenizer=reference_renderer().tokenizer)
    completeness = next(check for check in report.checks if check.name == "completeness")
    assert completeness.passed, completeness.verdict


GPT_OSS_SIM = (
    "--sim-family", "gpt-oss", "--reasoning-parser", "gpt-oss", "--tool-call-parser", "gpt-oss",
    "--sim-tool-call-rate", "0.5", "--sim-mean-reasoning-tokens", "24", "--sim-mean-answer-tokens", "16",
    "--sim-length-sigma", "0.3",
    # One answer per prompt, as SGLang's deterministic inference gives: which answers call a tool is then the
    # tests' fixed fact (sampled anew, 4 whole conversations of 2 turns all ended without a call, 1 run in 16).
    "--enable-deterministic-inference",
)  # fmt: skip
INVENTED_ANSWER = "<|start|>assistant<|channel|>final<|message|><|end|>"
"""The history a gpt-oss tool call became when its split dropped the call: an empty final answer."""


def _gpt_oss_tool_run(
    tmp_path: Path, *extra: str, again: Any = None, user_turns: int = 3
) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """gpt-oss conversations of `user_turns` user turns, every line declaring a tool, regenerated on the simulator
    (`again(output, document, url)`: called while the simulator still runs)."""
    from datagen_operator.tokenizer.standin import ensure_standin_tokenizer

    model_dir = ensure_standin_tokenizer(family="gpt-oss")
    items = [
        {"id": f"w{i:02d}", "tools": TOOLS, "messages": [
            message for t in range(user_turns) for message in (
                {"role": "user", "content": f"weather question {i}.{t}?"},
                {"role": "assistant", "content": f"{ORIGINAL} {i}.{t}"},
            )
        ]}
        for i in range(12)
    ]  # fmt: skip
    output = tmp_path / "out"
    document = local_spec(
        model_dir, write_dataset(tmp_path / "chats.jsonl", items), output,
        **{"model.preset": "gpt-oss", "generation.turns": "all"},
    )  # fmt: skip
    with start_sim(*GPT_OSS_SIM, tokenizer_dir=model_dir) as server:
        assert run_inprocess(document, [server.url], *extra) == EXIT_OK
        if again is not None:
            again(output, document, server.url)
    return output, document, items


def test_a_gpt_oss_answer_that_calls_a_tool_ends_its_conversation_with_the_call_recorded(tmp_path: Path) -> None:
    output, document, _ = _gpt_oss_tool_run(tmp_path)
    tokenizer = load_tokenizer(Path(document["model"]["path"]), trust_remote_code=False)
    records = list(iter_records(output))
    called = [r for r in records if r["answer_tool_calls"]]
    assert called and len(called) < len(records), "the simulator calls a tool in about half the answers"
    for record in called:
        assert record["output_ids"][-1] == GPT_OSS_CALL_ID  # harmony's <|call|> ended the answer
        [call] = record["answer_tool_calls"]  # one call a harmony message, as SGLang's gpt-oss parser returns it
        assert call["name"] == "get_weather" and set(json.loads(call["arguments"])) <= {"city"}
        assert record["answer_content"] == "" and record["answer_reasoning"]
    plain = [r for r in records if not r["answer_tool_calls"]]
    assert all(r["answer_tool_calls"] == [] and r["answer_content"] for r in plain)
    # Each call ends its conversation: the turns after it are cut with their cause, none is generated.
    cut = {(e["id"], e["sample"], e["turn"]): e for e in iter_rejects(output) if e.get("kind") == "turns"}
    ended = {(r["id"], r["sample"], r["turn"] + 1) for r in called if r["turn"] < 2}
    assert ended and set(cut) == ended and {e["cause"] for e in cut.values()} == {"answer_called_tool"}
    assert "calls a tool (get_weather)" in next(iter(cut.values()))["reason"]
    assert not [r for r in records if (r["id"], r["sample"], r["turn"]) in ended]
    for record in records:  # no history holds an answer the model never gave
        assert INVENTED_ANSWER not in tokenizer.decode(record["input_ids"], skip_special_tokens=False)
    state = progress(output)
    assert state["turns_cut"]["answer_called_tool"] == sum(e["turns"] - e["turn"] for e in cut.values())
    report = verify_output(output, _spec_model(document), tokenizer=tokenizer)
    fidelity = next(check for check in report.checks if check.name == "prompt_fidelity")
    assert report.passed and fidelity.total == len(records), fidelity.verdict


def test_the_conversations_export_keeps_a_last_answers_tool_call_as_sglang_returned_it(tmp_path: Path) -> None:
    """A conversation whose last planned answer calls a tool is whole: the conversations export writes that answer
    with its calls (`tool_calls`, as SGLang's chat endpoint returns them), not as an empty answer (gpt-oss's
    content is '' beside a call)."""
    from datagen_operator.cli import main as datagen

    output, document, _ = _gpt_oss_tool_run(tmp_path, user_turns=2)  # about half the last answers call
    run_file = tmp_path / "run.yaml"
    run_file.write_text(json.dumps({"apiVersion": API_GROUP_VERSION, "kind": "DataGenRun",
                                    "metadata": {"name": "t"}, "spec": document}))  # fmt: skip
    out = tmp_path / "export"
    args = ["export", str(output), "--run", str(run_file), "--format", "conversations", "--out", str(out)]
    assert datagen(args) == EXIT_OK
    rows = [
        orjson.loads(line) for part in sorted((out / "data").glob("*.jsonl")) for line in part.read_bytes().splitlines()
    ]
    records = {(r["id"], r["sample"], r["turn"]): r for r in iter_records(output)}
    exported_calls = 0
    for row in rows:
        answers = [message for message in row["conversations"] if message["role"] == "assistant"]
        for turn, message in enumerate(answers):
            record = records[(row["id"], row["sample"], turn)]
            expected = [{"type": "function", "function": call} for call in record["answer_tool_calls"]]
            assert message.get("tool_calls", []) == expected, (row["id"], turn)
            assert message["content"] == record["answer_content"]
            exported_calls += bool(expected)
    assert exported_calls, "some whole conversation ends on a call"


def test_verify_fails_a_conversation_continued_after_a_tool_call_on_an_invented_empty_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store as the run made it before calls were parsed for gpt-oss: the call's split was an empty answer and
    the conversation went on with it. Verify re-splits the sampled answers and fails it."""
    import datagen_operator.worker.inputs as worker_inputs

    class CallBlind(AnswerSplitter):  # the split that dropped harmony calls: <|call|> trimmed, no calls parsed
        def __init__(self, *args: Any) -> None:
            super().__init__(*args[:4])

    monkeypatch.setattr(worker_inputs, "AnswerSplitter", CallBlind)
    output, document, _ = _gpt_oss_tool_run(tmp_path)
    monkeypatch.undo()
    tokenizer = load_tokenizer(Path(document["model"]["path"]), trust_remote_code=False)
    records = list(iter_records(output))
    invented = [r for r in records if INVENTED_ANSWER in tokenizer.decode(r["input_ids"], skip_special_tokens=False)]
    assert invented and not [e for e in iter_rejects(output) if e.get("cause") == "answer_called_tool"]
    report = verify_output(output, _spec_model(document), tokenizer=tokenizer)
    fidelity = next(check for check in report.checks if check.name == "prompt_fidelity")
    assert not report.passed and not fidelity.passed
    keys = {(r["id"], r["sample"], r["turn"]): r for r in records}
    calls = [r for r in records if r["output_ids"][-1] == GPT_OSS_CALL_ID]
    after = [key for key in keys if key[2] and keys[(key[0], key[1], key[2] - 1)] in calls]
    assert f"{len(after)} turns were generated after an answer that called a tool" in fidelity.verdict
    assert f"{len(calls)}/{len(records)} recorded answer splits differ from the split" in fidelity.verdict


def test_a_crash_between_a_tool_call_and_its_cut_ends_the_conversation_on_resume(tmp_path: Path) -> None:
    cut: set[tuple[str, int, int]] = set()
    before: list[int] = []

    def crash_before_the_cuts(output: Path, document: dict[str, Any], url: str) -> None:
        path = OutputLayout(output).rejects(0)
        lines = path.read_bytes().splitlines(keepends=True)
        cut.update((e["id"], e["sample"], e["turn"]) for e in map(orjson.loads, lines) if e["kind"] == "turns")
        path.write_bytes(b"".join(line for line in lines if b'"kind":"turns"' not in line))
        before.append(sum(raw_turn_keys(output).values()))
        assert run_inprocess(document, [url]) == EXIT_OK

    output, _, _ = _gpt_oss_tool_run(tmp_path, "--no-compact", again=crash_before_the_cuts)
    entries = [e for e in iter_rejects(output) if e.get("kind") == "turns"]
    assert cut and {(e["id"], e["sample"], e["turn"]) for e in entries} == cut
    assert {e["cause"] for e in entries} == {"answer_called_tool"}
    assert len(list(iter_records(output))) == before[0]  # nothing sent after a call
