"""Whether shards x clients.concurrency keep the servers' batches full (checks/batch_fill.py), from each server's
/server_info as SGLang 0.5.23 reports it (`internal_states[i].effective_max_running_requests_per_dp`)."""

from __future__ import annotations

from typing import Any

import pytest

from datagen_operator.api import SpecError, parse_spec
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.checks.batch_fill import (
    BATCH_FULL,
    AutoConcurrency,
    auto_concurrency,
    judge_batch_fill,
    suggested_concurrency,
)
from datagen_operator.checks.canary_judgment import CanaryRecord, with_batch_fill, without_stale_batch_fill
from datagen_operator.engine.limits import BatchLimits, batch_limits, max_running_requests_per_rank
from tests.manifests import local_spec


def info(*ranks: tuple[int, int]) -> dict[str, Any]:
    """/server_info with one internal state per DP rank: (max running requests, token capacity)."""
    return {
        "max_total_num_tokens": ranks[0][1],
        "internal_states": [
            {"effective_max_running_requests_per_dp": running, "memory_usage": {"token_capacity": pool}}
            for running, pool in ranks
        ],
    }


def test_a_servers_limits_are_the_sum_over_its_dp_ranks() -> None:
    assert batch_limits(info((128, 500_000), (128, 400_000))) == BatchLimits(256, 900_000)
    assert batch_limits({"max_total_num_tokens": 10, "internal_states": [{"last_gen_throughput": 0.0}]}) is None
    assert batch_limits({}) is None, "an older SGLang: nothing said, nothing judged"


def test_sglangs_running_limit_per_rank() -> None:
    # KVCacheConfigurator.resolve_max_num_reqs: asked, split over attention DP, capped at half the pool.
    assert max_running_requests_per_rank(1_000_000, 32_768, 256, attn_dp_size=4) == 64
    assert max_running_requests_per_rank(100, 32_768, 256) == 50
    # Not asked: 512 per context the pool holds, clamped to 2048..4096, capped at half the pool.
    assert max_running_requests_per_rank(1_000_000, 32_768) == 4096
    assert max_running_requests_per_rank(163_840, 32_768) == 2560
    assert max_running_requests_per_rank(16_384, 32_768) == 2048
    assert max_running_requests_per_rank(2_000, 32_768) == 1000


def test_too_few_requests_in_flight_is_a_warning_with_the_number_that_fills_the_batch() -> None:
    two = [BatchLimits(256, 10_000_000)] * 2
    check = judge_batch_fill(1, 64, two)
    assert check is not None and check.name == BATCH_FULL and check.passed, "a warning, never a halt"
    assert (check.count, check.total, check.rate) == (64, 512, 0.125)
    assert check.verdict == (
        "64 requests in flight for 2 servers that run 256 each: at most 12% of their batch slots used; "
        "set clients.concurrency: 564"
    )
    assert suggested_concurrency(512, 1) == 564 and suggested_concurrency(512, 4) == 141
    sharded = judge_batch_fill(4, 16, two)
    assert sharded is not None and sharded.verdict.endswith("set clients.concurrency: 141 (with clients.shards: 4)")


def test_the_token_pool_bounds_the_batch_as_it_bounds_sglangs() -> None:
    # 100k tokens of pool hold 100 requests of 1,000 tokens: max_running_requests 256 is never reached.
    check = judge_batch_fill(1, 64, [BatchLimits(256, 100_000)], tokens_per_request=1_000)
    assert check is not None and check.total == 100
    assert "run 100 each: at most 64% of their batch slots used; set clients.concurrency: 110" in check.verdict


def test_enough_requests_fill_the_batch_and_unknown_servers_are_not_judged() -> None:
    full = judge_batch_fill(2, 300, [BatchLimits(256, 10_000_000), BatchLimits(128, 10_000_000)])
    assert full is not None and full.verdict == "600 requests in flight fill the 384 batch slots of 2 servers (256+128)"
    assert judge_batch_fill(1, 64, [None, None]) is None
    tiny = judge_batch_fill(1, 4, [BatchLimits(4096, 10_000_000)])
    assert tiny is not None and "4 requests in flight for 1 server that run 4096 each: at most 0.09% of" in tiny.verdict


def test_a_passed_canary_carries_the_warning_and_its_check(tmp_path: Any, standin_tokenizer: Any) -> None:
    spec = parse_spec(
        local_spec(standin_tokenizer, tmp_path / "d.jsonl", tmp_path / "out", **{"clients.concurrency": 16})
    )
    records = [CanaryRecord("p", [1] * 300, [2] * 700, {"type": "stop"}, 700, False, frozenset())] * 2
    passed = StepOutcome(True, "Passed", "2/2 canary outputs pass (token counts, termination)")
    outcome = with_batch_fill(passed, spec, [BatchLimits(64, 1_000_000)], records)
    assert outcome.passed and outcome.reason == "Passed"
    assert outcome.message == (
        "2/2 canary outputs pass (token counts, termination); warning: 16 requests in flight for 1 server that "
        "run 64 each: at most 25% of their batch slots used; set clients.concurrency: 71"
    )
    assert [c.name for c in outcome.checks] == [BATCH_FULL]
    back = StepOutcome.from_storage(outcome.for_storage())
    assert back.checks[0].verdict == outcome.checks[0].verdict, "recorded in the canary's verdict"
    failed = StepOutcome(False, "Failed", "x")
    assert with_batch_fill(failed, spec, [BatchLimits(64, 1_000_000)], records) == failed

    # Remembered for a resume: the warning holds for 16 in flight; after clients.concurrency 71 it goes.
    assert without_stale_batch_fill(outcome, spec) == outcome
    followed = spec.model_copy(update={"clients": spec.clients.model_copy(update={"concurrency": 71})})
    fresh = without_stale_batch_fill(back, followed)
    assert fresh.message == "2/2 canary outputs pass (token counts, termination)" and fresh.checks == ()


def test_concurrency_auto_is_the_number_that_fills_the_servers_batches() -> None:
    # The warning's rule: slots x 1.1 over the shards, rounded up; the token pool bounds the slots.
    two = [BatchLimits(64, 10_000_000)] * 2
    assert auto_concurrency(1, two) == AutoConcurrency(
        141, "clients.concurrency auto: 141 per shard for 2 servers of 64 slots"
    )
    assert (
        auto_concurrency(2, two).said == "clients.concurrency auto: 71 per shard x 2 shards for 2 servers of 64 slots"
    )
    mixed = auto_concurrency(1, [BatchLimits(256, 10_000_000), BatchLimits(128, 100_000)], tokens_per_request=1_000)
    assert mixed == AutoConcurrency(392, "clients.concurrency auto: 392 per shard for 2 servers of 256+100 slots")
    assert auto_concurrency(1, [BatchLimits(4096, 10**9)] * 4).concurrency == 4096, "clients.concurrency's bound"
    unknown = auto_concurrency(2, [None])
    assert unknown.concurrency == 64 and "the default (no server said its batch limits" in unknown.said
    # Each result is filled by its own number: the batch_full check never warns of it.
    for shards, servers in ((1, two), (2, two), (3, [BatchLimits(100, 10**9)])):
        check = judge_batch_fill(shards, auto_concurrency(shards, servers).concurrency, servers)
        assert check is not None and check.count >= check.total


def test_the_spec_takes_auto_or_a_bounded_integer_and_names_the_field(tmp_path: Any, standin_tokenizer: Any) -> None:
    def spec(concurrency: Any) -> Any:
        return parse_spec(
            local_spec(
                standin_tokenizer, tmp_path / "d.jsonl", tmp_path / "out", **{"clients.concurrency": concurrency}
            )
        )

    assert spec("auto").clients.concurrency == "auto" and spec(4096).clients.concurrency == 4096
    for bad in ("auto2", 0, 5000, "64", True, 1.5):
        with pytest.raises(SpecError) as refused:
            spec(bad)
        assert "clients.concurrency" in str(refused.value) and "or `auto`" in str(refused.value), str(refused.value)
    assert spec("auto").clients.per_shard(36) == 36 and spec(8).clients.per_shard(36) == 8
    assert spec("auto").clients.per_shard(None) == 64, "auto without a canary's number: the default"


def test_a_canary_of_an_auto_run_sizes_records_and_keeps_the_number(tmp_path: Any, standin_tokenizer: Any) -> None:
    def spec(concurrency: Any, shards: int = 2) -> Any:
        changes = {"clients.concurrency": concurrency, "clients.shards": shards}
        return parse_spec(local_spec(standin_tokenizer, tmp_path / "d.jsonl", tmp_path / "out", **changes))

    auto = spec("auto")
    records = [CanaryRecord("p", [1] * 300, [2] * 700, {"type": "stop"}, 700, False, frozenset())] * 2
    passed = StepOutcome(True, "Passed", "2/2 canary outputs pass (token counts, termination)")
    outcome = with_batch_fill(passed, auto, [BatchLimits(64, 1_000_000)], records)
    assert outcome.passed and outcome.concurrency == 36
    assert outcome.message == (
        "2/2 canary outputs pass (token counts, termination); "
        "clients.concurrency auto: 36 per shard x 2 shards for 1 server of 64 slots"
    ), "no warning: the batch is sized to fill"
    (check,) = outcome.checks
    assert (check.name, check.count, check.total) == (BATCH_FULL, 72, 64)
    assert with_batch_fill(passed, spec(16), [BatchLimits(64, 1_000_000)], records).concurrency is None

    # Recorded in the verdict (canary.verdict.json, the termination message): a resume sends at the same number.
    back = StepOutcome.from_storage(outcome.for_storage())
    assert back.concurrency == 36
    assert without_stale_batch_fill(back, auto) == back
    # The spec set a number since (a live field): the verdict's number goes, and the check judged at 36.
    fixed = without_stale_batch_fill(back, spec(100))
    assert fixed.concurrency is None and fixed.checks == ()
    # A verdict judged at a fixed number, the spec changed to auto since: sized from the check's batch slots.
    judged = with_batch_fill(passed, spec(16), [BatchLimits(64, 1_000_000)], records)
    resumed = without_stale_batch_fill(StepOutcome.from_storage(judged.for_storage()), auto)
    assert resumed.concurrency == 36 and "warning" not in resumed.message


def test_the_workers_command_carries_the_canarys_number_locally(tmp_path: Any, standin_tokenizer: Any) -> None:
    from datagen_operator.api import load_run
    from datagen_operator.local.runner import LocalRunner
    from datagen_operator.worker.config import build_parser, config_from_args
    from tests.manifests import local_run, write_run

    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    run_file = write_run(
        tmp_path / "run.yaml",
        local_run(standin_tokenizer, dataset, tmp_path / "out", **{"clients.concurrency": "auto"}),
    )
    runner = LocalRunner(load_run(run_file), tmp_path / "out", simulator=True)
    runner.canary = StepOutcome(True, "Passed", "x; clients.concurrency auto: 36 per shard", concurrency=36)
    argv = runner.worker_argv(0, ["http://127.0.0.1:1"])
    assert argv[argv.index("--concurrency") + 1] == "36"
    # The worker sends at it (and at the spec's own number where the spec sets one).
    args = build_parser().parse_args([*argv[argv.index("worker") + 1 :], "--run", str(run_file)])
    assert config_from_args(args, {}).concurrency == 36
    numbered = write_run(
        tmp_path / "n.yaml", local_run(standin_tokenizer, dataset, tmp_path / "out", **{"clients.concurrency": 8})
    )
    args = build_parser().parse_args([*argv[argv.index("worker") + 1 :], "--run", str(numbered)])
    assert config_from_args(args, {}).concurrency == 8, "a number in the spec wins (a live change after the canary)"
