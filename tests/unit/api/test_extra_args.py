"""Server args that change the data: each refused flag is refused by `datagen validate` at its extraArgs item
(also abbreviated, as SGLang's parser reads it), speculative decoding is refused with the sampling keys its
verify step does not honour, and each fingerprinted server arg is recorded and named when it changes.
SGLang's side of these tables: tests/contract/test_data_args.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import SpecError, parse_run
from datagen_operator.api.crd import crd_manifest
from datagen_operator.api.errors import FieldError
from datagen_operator.api.extra_args import (
    MANAGED_FLAGS,
    MANAGED_REASON,
    REFUSED_FLAGS,
    SPECULATIVE_INEXACT_SAMPLING,
    extra_arg_cel_rules,
)
from datagen_operator.output.fingerprint import DATA_SERVER_ARGS, diff_fingerprints, server_fingerprint
from tests.manifests import REPO, example_run

FIXES = ("instead", "cannot be used", "leave it out")


def refusals(extra_args: list[str], **sampling: Any) -> list[FieldError]:
    document = example_run(
        **{"spec.server.extraArgs": extra_args, **{f"spec.generation.sampling.{k}": v for k, v in sampling.items()}}
    )
    try:
        parse_run(document)
    except SpecError as error:
        return error.errors
    return []


@pytest.mark.parametrize("flag", sorted(REFUSED_FLAGS))
@pytest.mark.parametrize("spelling", ["value apart", "value joined"])
def test_a_refused_flag_is_named_at_its_item_with_the_fix(flag: str, spelling: str) -> None:
    extra = [flag, "x"] if spelling == "value apart" else [f"{flag}=x"]
    (error,) = refusals(["--watchdog-timeout", "600", *extra])
    assert error.field == "spec.server.extraArgs[2]"
    assert error.message == f"{flag} {REFUSED_FLAGS[flag]}"
    assert any(fix in REFUSED_FLAGS[flag] for fix in FIXES), "the reason must say what to do instead"


@pytest.mark.parametrize("flag", sorted(REFUSED_FLAGS))
def test_an_abbreviated_refused_flag_is_refused_as_sglang_reads_it(flag: str) -> None:
    abbreviation = flag[:-1]
    (error,) = refusals([abbreviation])
    assert error.field == "spec.server.extraArgs[0]"
    assert error.message.startswith(f"{abbreviation} is read by SGLang as {flag} ")
    assert error.message.endswith(f"{flag} {REFUSED_FLAGS[flag]}")


@pytest.mark.parametrize("flag", sorted(MANAGED_FLAGS))
def test_an_abbreviated_managed_flag_is_refused(flag: str) -> None:
    for spelling in (flag, flag[:-1]):
        (error,) = refusals([f"{spelling}=1"])
        assert (error.field, error.message) == ("spec.server.extraArgs[0]", f"{spelling} {MANAGED_REASON}")


@pytest.mark.parametrize(
    "extra_args",
    [
        # SGLang flags that share a prefix with a refused or managed one, and values that look like flags
        ["--log-level-http", "info", "--enable-metrics-for-all-schedulers"],
        ["--enable-dp-attention-local-control-broadcast", "--watchdog-timeout=600"],
        ["--", "-x", "--speculative-algorithm", "EAGLE"],
    ],
)
def test_other_flags_pass(extra_args: list[str]) -> None:
    assert refusals(extra_args) == []


# A value of each sampling key its neutral value is not (the spec's bounds allow each).
INEXACT_VALUES = {"min_p": 0.05, "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1,
                  "min_new_tokens": 8}  # fmt: skip


def test_every_inexact_sampling_key_has_a_value() -> None:
    assert sorted(INEXACT_VALUES) == sorted(SPECULATIVE_INEXACT_SAMPLING)


@pytest.mark.parametrize("key", sorted(SPECULATIVE_INEXACT_SAMPLING))
@pytest.mark.parametrize("flag", ["--speculative-algorithm", "--speculative-algo=EAGLE"])
def test_speculative_decoding_refuses_the_sampling_keys_it_does_not_honour(key: str, flag: str) -> None:
    (error,) = refusals([flag, "EAGLE"], **{key: INEXACT_VALUES[key]})
    assert error.field == f"spec.generation.sampling.{key}"
    assert "speculative decoding" in error.message and f"drop {key}" in error.message


@pytest.mark.parametrize("key", sorted(SPECULATIVE_INEXACT_SAMPLING))
def test_neutral_values_and_runs_without_speculative_decoding_pass(key: str) -> None:
    assert refusals(["--speculative-algorithm", "EAGLE"], **{key: SPECULATIVE_INEXACT_SAMPLING[key]}) == []
    assert refusals(["--watchdog-timeout", "600"], **{key: INEXACT_VALUES[key]}) == []


def test_the_crd_carries_a_rule_per_refused_flag_and_one_for_the_managed() -> None:
    """The rules' verdicts are the API server's to give (tests/operator/test_schema_corpus.py)."""
    spec = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["properties"]["server"]["properties"]["extraArgs"]["items"]["x-kubernetes-validations"]
    assert rules == extra_arg_cel_rules()
    for flag in REFUSED_FLAGS:
        (rule,) = [rule for rule in rules if f'"{flag}".startsWith(' in rule["rule"]]
        assert REFUSED_FLAGS[flag] in rule["messageExpression"]
    (managed,) = [rule for rule in rules if "exists(" in rule["rule"]]
    assert all(f'"{flag}"' in managed["rule"] for flag in MANAGED_FLAGS)
    paths = {rule.get("fieldPath") for rule in spec["x-kubernetes-validations"]}
    assert {f".generation.sampling.{key}" for key in SPECULATIVE_INEXACT_SAMPLING} <= paths


SERVER_INFO = {"version": "0.5.23", "port": 30000, "host": "0.0.0.0", "tp_size": 8, "random_seed": 1066221787,
               "max_total_num_tokens": 912000, "startup_time": 1.0, **{key: None for key in DATA_SERVER_ARGS}}  # fmt: skip


@pytest.mark.parametrize("key", list(DATA_SERVER_ARGS))
def test_a_fingerprinted_server_arg_is_recorded_and_its_change_named(key: str) -> None:
    before = server_fingerprint(SERVER_INFO)
    after = server_fingerprint({**SERVER_INFO, key: "changed"})
    assert after["args"][key] == "changed"
    assert diff_fingerprints(before, after) == [f'args.{key}: null -> "changed"']


@pytest.mark.parametrize("key", ["port", "host", "tp_size", "random_seed", "max_total_num_tokens", "startup_time"])
def test_replica_and_restart_details_are_not_fingerprinted(key: str) -> None:
    assert server_fingerprint({**SERVER_INFO, key: "other"}) == server_fingerprint(SERVER_INFO)


def test_the_review_in_the_docs_names_every_refused_and_fingerprinted_flag() -> None:
    review = (REPO / "docs" / "data-args.md").read_text()
    named = {flag for flag in [*REFUSED_FLAGS, *DATA_SERVER_ARGS.values()] if f"`{flag}`" in review}
    assert sorted({*REFUSED_FLAGS, *DATA_SERVER_ARGS.values()} - named) == []
