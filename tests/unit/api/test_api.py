"""The DataGenRun models: strict parsing, defaults, and errors that name the field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import SpecError, load_run, parse_run
from datagen_operator.api.duration import format_duration, parse_duration
from datagen_operator.api.resolve import resolve_model
from datagen_operator.engine.launch import server_argv
from datagen_operator.presets import preset_names
from tests.manifests import DELETE, EXAMPLES, changed, example_run
from tests.schema_corpus import MUTATIONS, Mutation, validate_verdict


def errors_of(document: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        parse_run(document)
    return {error.field: error.message for error in caught.value.errors}


def test_every_example_is_a_valid_run_and_every_preset_has_one() -> None:
    examples = sorted(EXAMPLES.rglob("*.yaml"))
    for path in examples:
        run = load_run(path)  # raises SpecError naming the field
        assert server_argv(run.spec)[:3] == ["python3", "-m", "sglang.launch_server"], path
        if path.parent.name == "presets":
            assert run.spec.model.preset == path.stem, f"{path} shows preset {run.spec.model.preset}"
    assert {path.stem for path in examples if path.parent.name == "presets"} == set(preset_names())


def test_defaults_and_durations() -> None:
    run = parse_run(example_run())
    assert run.spec.server.startup_timeout == 45 * 60
    assert run.spec.server.tp_size == 8 and run.spec.server.dp_size == 1
    assert run.spec.clients.request_timeout == 3600
    assert run.spec.model_dump(mode="json")["server"]["startupTimeout"] == "45m"


@pytest.mark.parametrize(
    ("text", "seconds"), [("45m", 2700), ("1h30m", 5400), ("90s", 90), ("500ms", 0.5), ("1.5h", 5400), (30, 30)]
)
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_format_duration_round_trips() -> None:
    for seconds in (2700, 5400, 90, 3661, 0.5):
        assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("bad", ["45", "forty", "-1m", "1d", ""])
def test_bad_durations_are_refused(bad: str) -> None:
    assert "spec.server.startupTimeout" in errors_of(example_run(**{"spec.server.startupTimeout": bad}))


def test_unknown_field_is_refused_with_its_path() -> None:
    errors = errors_of(example_run(**{"spec.server.gpuCount": 8}))
    assert "spec.server.gpuCount" in errors
    assert "unknown field" in errors["spec.server.gpuCount"]


def test_tensor_parallel_must_divide_gpus() -> None:
    errors = errors_of(example_run(**{"spec.server.tensorParallel": 3}))
    (field, message), *_ = errors.items()
    assert field == "spec.server.tensorParallel"  # where the CRD's CEL rule reports it too
    assert "tensorParallel 3 does not divide gpus 8" in message


def server_changes(**server: object) -> dict[str, Any]:
    """The Kimi example (8 GPUs, tensorParallel 8) with server fields set (`DELETE` removes one)."""
    return example_run(**{f"spec.server.{key}": value for key, value in server.items()})


def test_a_group_of_nodes_needs_tensor_parallel_over_all_its_gpus() -> None:
    errors = errors_of(server_changes(nodes=2, tensorParallel=8))
    assert list(errors) == ["spec.server.tensorParallel"]  # where the CRD's CEL rule reports it too
    assert "tensorParallel 8 is not gpus x nodes = 8 x 2" in errors["spec.server.tensorParallel"]
    server = parse_run(server_changes(nodes=2, tensorParallel=DELETE)).spec.server
    assert (server.tp_size, server.dp_size, server.server_gpus) == (16, 1, 16)


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"attentionDataParallel": 3}, "attentionDataParallel 3 does not divide tensorParallel 8"),
        ({"tensorParallel": 4, "attentionDataParallel": 2}, "SGLang refuses data-parallel replicas (--dp-size 2)"),
    ],
)
def test_attention_data_parallel_must_fit_the_tensor_parallel_group(server: dict[str, int], message: str) -> None:
    errors = errors_of(server_changes(**server))
    assert list(errors) == ["spec.server.attentionDataParallel"]
    assert message in errors["spec.server.attentionDataParallel"]


def test_data_parallel_inside_a_pod() -> None:
    run = parse_run(example_run(**{"spec.server.tensorParallel": 4}))
    assert (run.spec.server.tp_size, run.spec.server.dp_size) == (4, 2)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.server.gpus", 0, "spec.server.gpus"),
        ("spec.clients.shards", 0, "spec.clients.shards"),
        ("spec.checks.minReasoningRate", 1.5, "spec.checks.minReasoningRate"),
        ("spec.checks.maxTruncationRate", -0.1, "spec.checks.maxTruncationRate"),
        ("spec.server.replicas", 0, "spec.server.replicas"),
        ("spec.checks.onFailure", "Ignore", "spec.checks.onFailure"),
        ("spec.generation.sampling.max_new_tokens", 0, "spec.generation.sampling.max_new_tokens"),
    ],
)
def test_ranges_are_checked(path: str, value: Any, field: str) -> None:
    assert field in errors_of(example_run(**{path: value}))


def test_openai_max_tokens_is_explained() -> None:
    document = example_run(**{"spec.generation.sampling": {"max_tokens": 100}})
    message = errors_of(document)["spec.generation.sampling.max_tokens"]
    assert "max_new_tokens" in message


def test_a_misspelled_export_flag_is_refused_naming_the_field_the_value_and_the_flags() -> None:
    """A typo in spec.export.excludeFlags would exclude nothing (bug 3): refused as the CRD's enum refuses it."""
    document = example_run(**{"spec.export": {"formats": ["trl"], "excludeFlags": ["truncated", "truncted"]}})
    errors = errors_of(document)
    assert set(errors) == {"spec.export.excludeFlags[1]"}
    message = errors["spec.export.excludeFlags[1]"]
    assert "truncted" in message
    assert all(name in message for name in ("token_count_mismatch", "truncated", "retracted", "truncated_by_memory"))


def test_unpinned_image_is_refused() -> None:
    for image in ("lmsysorg/sglang:latest", "lmsysorg/sglang"):
        message = errors_of(example_run(**{"spec.server.image": image}))["spec.server.image"]
        assert "not pinned" in message
    assert parse_run(example_run(**{"spec.server.image": "registry:5000/sglang:v0.5.23"}))


def test_kimi_parser_contradicts_kimi_k25() -> None:
    message = errors_of(example_run(**{"spec.server.reasoningParser": "kimi"}))["spec.server.reasoningParser"]
    assert "◁think▷" in message and "<think>" in message and "use kimi_k2" in message


def test_no_reasoning_parser_contradicts_a_thinking_preset() -> None:
    message = errors_of(example_run(**{"spec.server.reasoningParser": "none"}))["spec.server.reasoningParser"]
    assert "reasoning_content is null" in message


def test_unknown_parser_name_lists_choices() -> None:
    message = errors_of(example_run(**{"spec.server.reasoningParser": "kimi-k2"}))["spec.server.reasoningParser"]
    assert "kimi_k2" in message and "not a reasoning parser" in message


@pytest.mark.parametrize("field", ["reasoningParser", "toolCallParser"])
def test_auto_parser_is_refused_for_what_it_is_not_as_unknown_to_sglang(field: str) -> None:
    # SGLang accepts `auto` (it picks from the chat template at start-up); the spec refuses it because a run
    # names its parser, and says so without implying SGLang would refuse it.
    message = errors_of(example_run(**{f"spec.server.{field}": "auto"}))[f"spec.server.{field}"]
    assert "lets SGLang pick" in message and "leave it unset" in message and "kimi_k2" in message
    assert "is not a" not in message


def test_unknown_preset_without_parsers_lists_presets_and_how_to_set_parsers() -> None:
    message = errors_of(example_run(**{"spec.model.preset": "llama-5"}))["spec.model.preset"]
    assert "kimi-k2.5" in message and "qwen3" in message
    assert "reasoningParser" in message and "toolCallParser" in message


def test_no_preset_with_explicit_parsers_is_accepted() -> None:
    document = example_run(
        **{"spec.model.preset": DELETE, "spec.server.reasoningParser": "qwen3", "spec.server.toolCallParser": "qwen25"}
    )
    resolved = resolve_model(parse_run(document).spec)
    assert (resolved.reasoning_parser, resolved.tool_call_parser) == ("qwen3", "qwen25")
    assert (resolved.think_start, resolved.think_end) == ("<think>", "</think>")


def test_thinking_on_a_non_thinking_preset_is_refused() -> None:
    document = example_run(**{"spec.model.preset": "kimi-k2-instruct"})
    message = errors_of(document)["spec.generation.thinking"]
    assert "no thinking mode" in message
    document = changed(document, {"spec.generation.thinking": False})
    assert resolve_model(parse_run(document).spec).reasoning_parser is None


def test_thinking_off_on_an_always_thinking_preset_is_refused() -> None:
    document = example_run(**{"spec.model.preset": "kimi-k2-thinking", "spec.generation.thinking": False})
    assert "always thinks" in errors_of(document)["spec.generation.thinking"]


def test_volume_needs_exactly_one_source() -> None:
    document = example_run(**{"spec.dataset.volume": {}})
    assert "spec.dataset.volume" in errors_of(document)


def test_preset_defaults_apply() -> None:
    resolved = resolve_model(parse_run(example_run()).spec)
    assert resolved.reasoning_parser == "kimi_k2" and resolved.tool_call_parser == "kimi_k2"
    assert resolved.thinking and resolved.trust_remote_code
    assert resolved.think_end == "</think>"


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_validate_verdict_on_the_schema_corpus(mutation: Mutation) -> None:
    # The API server's side of the same corpus: tests/operator/test_schema_corpus.py.
    fields = validate_verdict(mutation.manifest())
    assert fields == ({mutation.refused_at} if mutation.refused_at else set())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.server.gpus", "8"),
        ("spec.generation.thinking", "yes"),
        ("spec.suspend", "false"),
        ("spec.clients.requestTimeout", 3600),
        ("spec.checks.minReasoningRate", "0.9"),
    ],
)
def test_types_are_strict_as_the_crd(path: str, value: Any) -> None:
    assert path in errors_of(example_run(**{path: value}))


def test_snake_case_spelling_of_a_camel_case_field_is_unknown() -> None:
    document = example_run(**{"spec.clients.max_attempts": 3})
    assert "unknown field" in errors_of(document)["spec.clients.max_attempts"]


def test_the_tokenizer_directory_is_the_tokenizer_path_else_the_model_path_and_no_field() -> None:
    from datagen_operator.api.crd import crd_manifest

    spec = parse_run(example_run()).spec
    assert spec.model.tokenizer_path is None and spec.model.tokenizer_dir == spec.model.path
    own = parse_run(example_run(**{"spec.model.tokenizerPath": "/models/tok"})).spec
    assert own.model.tokenizer_dir == "/models/tok"
    # a rule over the spec, not a field of it: not written, not read, not in the CRD
    assert "tokenizerDir" not in own.model.model_dump(by_alias=True)
    assert "tokenizer_dir" not in own.model.model_dump()
    (version,) = crd_manifest()["spec"]["versions"]
    spec_schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "tokenizerDir" not in spec_schema["properties"]["model"]["properties"]
