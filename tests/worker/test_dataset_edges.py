"""Dataset edges: a UTF-8 BOM, tool schemas SGLang's chat endpoint would not accept, integer ids, an empty
dataset; and, in a worker run, that every line set aside is never sent and does not count as a server error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from datagen_operator.api.progress import ShardProgress
from datagen_operator.output.readers import iter_rejects
from datagen_operator.prompts.dataset_ref import DatasetError, DatasetRef
from datagen_operator.prompts.line_shape import BAD_ID, BAD_JSON, DUPLICATE_ID, INVALID_TOOLS
from datagen_operator.prompts.lines import source_fields
from datagen_operator.prompts.pin import pin_dataset, prompt_hash
from datagen_operator.prompts.plan import plan_shard
from datagen_operator.prompts.scan import ShardScan
from datagen_operator.prompts.summary import EmptyDataset, check_dataset, dataset_summary
from tests.worker.dataset_corpus import INVALID_TOOLS_CASES, VALID_TOOLS_CASES
from tests.worker.proxy import CountingProxy
from tests.worker.simrun import check_records, progress, prompts, run_inprocess, spec, write_dataset

BOM = b"\xef\xbb\xbf"


def _prompt(prompt_id: Any, **extra: Any) -> dict[str, Any]:
    return {"id": prompt_id, "messages": [{"role": "user", "content": f"q {prompt_id}"}], **extra}


def _jsonl(path: Path, lines: list[dict[str, Any] | bytes], prefix: bytes = b"") -> Path:
    body = b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)
    path.write_bytes(prefix + body)
    return path


# --- BOM ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
def test_a_utf8_bom_keeps_the_first_prompt(tmp_path: Path, shards: int) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [_prompt(f"p{i}") for i in range(5)], prefix=BOM)
    plans = [plan_shard(DatasetRef(path), index, shards) for index in range(shards)]
    assert sorted(ref.id for plan in plans for ref in plan.prompts) == [f"p{i}" for i in range(5)]
    assert [m for plan in plans for m in plan.malformed] == []
    first = next(prompt for plan in plans for prompt in plan.iter_prompts() if prompt.id == "p0")
    assert (first.position, first.messages) == (0, [{"role": "user", "content": "q p0"}])


def test_a_utf16_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(orjson.dumps(_prompt("p0")).decode().encode("utf-16"))
    with pytest.raises(DatasetError, match="UTF-16"):
        plan_shard(DatasetRef(path), 0, 1)


# --- tools ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tools", "reason"), INVALID_TOOLS_CASES)
def test_an_invalid_tool_schema_is_set_aside_with_its_reason(tmp_path: Path, tools: Any, reason: str) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [_prompt("ok"), _prompt("bad", tools=tools)])
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert [ref.id for ref in plan.prompts] == ["ok"]
    [line] = plan.malformed
    assert (line.position, line.id, line.cause) == (1, "bad", INVALID_TOOLS)
    assert reason in line.reason, line.reason


@pytest.mark.parametrize("tools", VALID_TOOLS_CASES)
def test_a_tool_schema_sglang_accepts_is_kept(tmp_path: Path, tools: Any) -> None:
    path = _jsonl(tmp_path / "d.jsonl", [_prompt("ok", tools=tools)])
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert [ref.id for ref in plan.prompts] == ["ok"] and plan.malformed == []
    [prompt] = plan.iter_prompts()
    if isinstance(tools, list) and all("function" in tool and "type" in tool for tool in tools):
        assert prompt.tools == (tools or None)  # the OpenAI shape already: as it is
    else:  # read into it
        assert prompt.tools is None or all(tool["type"] == "function" for tool in prompt.tools)
        assert bool(prompt.tools) == (tools not in ("", None, []))


GLAIVE_TOOLS = [  # glaive / LLaMA-Factory glaive_toolcall_en_demo: bare function objects, in a JSON string
    {"name": "search_recipes", "description": "Search recipes", "parameters": {
        "type": "object", "properties": {"ingredients": {"type": "array", "items": {"type": "string"}}},
        "required": ["ingredients"]}},
]  # fmt: skip
REASON_TOOL_USE_TOOLS = [  # LLaMA-Factory reason_tool_use_demo: wrapped, with database type names
    {"type": "function", "function": {"name": "get_asset", "description": "Fetch an asset.", "parameters": {
        "type": "dict", "properties": {"identifier": {"type": "str", "default": "7"},
                                       "ids": {"type": "List[int]"}, "limit": {"type": "int"}}},
        "required": ["identifier"]}},
]  # fmt: skip


def test_the_fields_tool_shapes_are_read_as_sglang_and_specforge_read_them(tmp_path: Path) -> None:
    # Tools in a JSON string (json.loads, as SpecForge), bare function objects wrapped (SGLang's Tool needs
    # `function`), database type names rewritten as SGLang's request validation rewrites them for the template.
    lines = [
        _prompt("glaive", tools=orjson.dumps(GLAIVE_TOOLS).decode()),
        _prompt("reason", tools=orjson.dumps(REASON_TOOL_USE_TOOLS).decode()),
        _prompt("none", tools="[]"),
    ]
    path = _jsonl(tmp_path / "d.jsonl", lines)
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert plan.malformed == []
    glaive, reason, none = plan.iter_prompts()
    assert glaive.tools == [{"type": "function", "function": GLAIVE_TOOLS[0]}]
    assert reason.tools == [
        {"type": "function", "function": {"name": "get_asset", "description": "Fetch an asset.", "parameters": {
            "type": "object", "properties": {"identifier": {"type": "string", "default": "7"},
                                             "ids": {"type": "array"}, "limit": {"type": "integer"}}},
            "required": ["identifier"]}},
    ]  # fmt: skip
    assert none.tools is None
    assert lines[1]["tools"] == orjson.dumps(REASON_TOOL_USE_TOOLS).decode(), "the line itself is never changed"


# --- ids ------------------------------------------------------------------------------------------


def test_integer_ids_are_their_decimal_strings_and_a_collision_with_a_string_id_is_named(tmp_path: Path) -> None:
    # SpecForge's own test data numbers its lines. Integer 1 and string "1" are one stored id: the later is set
    # aside, its reason naming the collision; two integer 2s are a plain duplicate.
    lines = [_prompt(1), _prompt("1"), _prompt(2), _prompt(1.5), _prompt(True), _prompt("3"), _prompt(3), _prompt(2)]
    array = tmp_path / "d.json"
    array.write_bytes(orjson.dumps(lines))
    for path in (_jsonl(tmp_path / "d.jsonl", lines), array):
        plans = [plan_shard(DatasetRef(path), index, 2) for index in range(2)]
        kept = sorted((ref.position, ref.id) for plan in plans for ref in plan.prompts)
        assert kept == [(0, "1"), (2, "2"), (5, "3")]
        refused = sorted((m.position, m.cause, m.reason) for plan in plans for m in plan.malformed)
        assert [(position, cause) for position, cause, _ in refused] == [
            (1, DUPLICATE_ID), (3, BAD_ID), (4, BAD_ID), (6, DUPLICATE_ID), (7, DUPLICATE_ID)
        ]  # fmt: skip
        reasons = {position: reason for position, _, reason in refused}
        assert reasons[1].startswith(
            "id '1' collides: an earlier line holds it as the integer and this one as the string"
        )
        assert reasons[6].startswith(
            "id '3' collides: an earlier line holds it as the string and this one as the integer"
        )
        assert reasons[7] == "duplicate id '2' (first occurrence kept)"
        assert reasons[3] == "id must be a JSON string or an integer, got number 1.5"
        assert reasons[4] == "id must be a JSON string or an integer, got boolean true"


def test_a_parquet_integer_id_column_is_read_as_strings(tmp_path: Path) -> None:
    # One type per column: integer ids there cannot collide with string ids.
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [3, 1, 2], "messages": [[{"role": "user", "content": "q"}]] * 3}), path)
    plan = plan_shard(DatasetRef(path), 0, 1)
    assert [ref.id for ref in plan.prompts] == ["3", "1", "2"] and plan.malformed == []


def test_a_parquet_id_column_that_is_not_the_id_field_keeps_its_integers(tmp_path: Path) -> None:
    # Under another idField, `id` is a column like any other: the row the records carry (source_fields) and the
    # pin hashes keeps its integers, as the same line in JSONL does.
    rows = [{"uuid": f"u{n}", "id": n, "messages": [{"role": "user", "content": f"q{n}"}]} for n in (5, 6)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    items = list(ShardScan(DatasetRef(path, id_field="uuid"), 0, 1))
    assert [(ref.id, obj["id"]) for ref, obj in items] == [("u5", 5), ("u6", 6)]
    assert source_fields(items[0][1], "uuid") == '{"id":5}'
    jsonl = _jsonl(tmp_path / "d.jsonl", list(rows))
    pinned = pin_dataset(DatasetRef(path, id_field="uuid")).line_hashes.tolist()
    assert pinned == pin_dataset(DatasetRef(jsonl, id_field="uuid")).line_hashes.tolist()
    assert pinned == [prompt_hash(obj) for _, obj in items]  # as the feeder hashes each row it sends


# --- empty dataset --------------------------------------------------------------------------------


def test_an_empty_dataset_is_refused_naming_spec_dataset_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(BOM + b"\n\n")
    with pytest.raises(EmptyDataset, match=rf"^spec.dataset.path {empty}: the dataset is empty \(2 lines"):
        check_dataset(DatasetRef(empty))

    useless = _jsonl(tmp_path / "bad.jsonl", [_prompt(1.5), _prompt(False), b"{oops"])
    with pytest.raises(EmptyDataset) as raised:
        check_dataset(DatasetRef(useless))
    message = str(raised.value)
    assert message.startswith(f"spec.dataset.path {useless}: no valid prompt in 3 lines; set aside: ")
    assert "2 bad_id (e.g. line 1: id must be a JSON string or an integer, got number 1.5" in message
    assert "1 bad_json (e.g. line 3: bad JSON" in message

    summary = check_dataset(DatasetRef(_jsonl(tmp_path / "ok.jsonl", [_prompt("a"), _prompt(0.5), b"[]"])))
    assert (summary.lines, summary.prompts, summary.set_aside) == (3, 1, {BAD_ID: 1, "not_object": 1})
    assert dataset_summary(DatasetRef(useless)).set_aside == {BAD_ID: 2, BAD_JSON: 1}


def test_the_worker_refuses_an_empty_dataset_before_any_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = _jsonl(tmp_path / "d.jsonl", [_prompt(1.5), _prompt(False)])
    document = spec(dataset, tmp_path / "out")
    # Nothing listens on port 9: a worker that got past the dataset would wait for the server, then exit 4.
    assert run_inprocess(document, ["http://127.0.0.1:9"], "--server-timeout", "3") == EXIT_BAD_INPUT
    assert f"spec.dataset.path {dataset}: no valid prompt in 2 lines" in capsys.readouterr().err


# --- in a worker run ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy() -> Any:
    from tests.harness.sim import start_sim
    from tests.worker.simrun import SIM_FLAGS, standin

    with start_sim(*SIM_FLAGS, tokenizer_dir=standin()) as sim, CountingProxy(sim.url) as counting:
        yield counting


def test_lines_set_aside_are_never_sent_nor_server_errors_and_stay_aside_on_resume(tmp_path: Path, proxy) -> None:
    good = prompts(6)
    bad: dict[int, bytes] = {
        2: orjson.dumps(_prompt("bad-tools", tools=[{"type": "function", "function": {"name": ""}}])),
        3: orjson.dumps(_prompt(7.5)),
        # The template reads a tool call with .get(): a bare number cannot be rendered.
        5: orjson.dumps(
            {
                "id": "unrenderable",
                "messages": [
                    {"role": "assistant", "content": "a", "tool_calls": [5]},
                    {"role": "user", "content": "q"},
                ],
            }
        ),
    }
    dataset = write_dataset(tmp_path / "prompts.jsonl", good, bad)
    dataset.write_bytes(BOM + dataset.read_bytes())
    output = tmp_path / "out"
    document = spec(dataset, output, **{"generation.samplesPerPrompt": 2})

    before = len(proxy.generate_lengths)
    assert run_inprocess(document, [proxy.url]) == EXIT_OK
    assert len(proxy.generate_lengths) - before == 12  # 6 good prompts x 2 samples, nothing else
    check_records(output, good, samples=2)  # the first line (after the BOM) included

    causes = sorted((r["cause"], r["id"]) for r in iter_rejects(output))
    assert causes == [("bad_id", None), ("invalid_tools", "bad-tools"), ("unrenderable", "unrenderable")]
    state = progress(output)
    assert state["set_aside"] == {"bad_id": 1, "invalid_tools": 1, "unrenderable": 1}
    # 7 valid prompts and 2 malformed lines read: the rates' denominator.
    assert state["dataset_lines"] == 9 and ShardProgress.from_storage(orjson.dumps(state)).malformed_lines == 2
    # The unrenderable prompt's samples are set aside, not server errors (records_rejected feeds server_errors).
    assert (state["records_done"], state["records_set_aside"], state["records_rejected"]) == (12, 2, 0)
    assert (state["prompts_done"], state["prompts_total"], state["state"]) == (7, 7, "complete")

    before = len(proxy.generate_lengths)
    assert run_inprocess(document, [proxy.url]) == EXIT_OK
    assert len(proxy.generate_lengths) == before
    assert len(list(iter_rejects(output))) == 3
    assert progress(output)["set_aside"] == state["set_aside"]


def test_a_glaive_shaped_json_array_runs_as_published(tmp_path: Path, proxy: Any) -> None:
    # LLaMA-Factory's glaive_toolcall_en_demo.json, in small: a JSON array of ShareGPT conversations without ids,
    # function_call/observation turns, `tools` a JSON string of bare function objects (one line with none).
    def line(question: str, tools: str) -> dict[str, Any]:
        return {
            "conversations": [
                {"from": "human", "value": question},
                {
                    "from": "function_call",
                    "value": '{"name": "search_recipes", "arguments": {"ingredients": ["rice"]}}',
                },
                {"from": "observation", "value": '{"recipes": []}'},
                {"from": "gpt", "value": "None found."},
                {"from": "human", "value": "Thanks."},
                {"from": "gpt", "value": "You're welcome."},
            ],
            "tools": tools,
        }

    dataset = tmp_path / "glaive.json"
    lines = [line(f"Recipes with rice, {i}?", orjson.dumps(GLAIVE_TOOLS).decode()) for i in range(3)]
    dataset.write_bytes(orjson.dumps([*lines, line("Hello?", "[]")], option=orjson.OPT_INDENT_2))
    output = tmp_path / "out"
    assert run_inprocess(spec(dataset, output, **{"generation.turns": "all"}), [proxy.url]) == EXIT_OK
    state = progress(output)
    assert (state["state"], state["set_aside"], state["prompts_done"]) == ("complete", {}, 4)
    # One answered turn each: the turns after the dataset's tool result are not regenerated (docs/regenerate.md).
    assert state["records_done"] == 4 and state["tool_records"] == 3
