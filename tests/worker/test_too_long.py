"""Prompts longer than the server's context are set aside as `too_long` BEFORE sending.

SGLang answers 400 ("Requested token count exceeds the model's maximum context length") when
`len(input_ids) + max_new_tokens` is above its context; the worker reads the context from /server_info
and never sends such a request. A counting proxy between the worker and the simulator proves it: it sees
every /generate request, whatever the simulator does with an over-long one (shorten it or refuse it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from datagen_operator.api.exit_codes import EXIT_OK
from datagen_operator.engine.limits import ContextLimit, context_limit, too_long_reason
from datagen_operator.output.manifest import read_manifest
from datagen_operator.output.readers import iter_rejects
from tests.harness.sim import start_sim
from tests.worker.proxy import CountingProxy
from tests.worker.simrun import SIM_FLAGS, check_records, progress, prompts, run_inprocess, spec, standin, write_dataset

# --- the rule, pure -------------------------------------------------------------------------------


def test_context_is_read_from_server_info_tightest_replica_first() -> None:
    assert context_limit([{"context_length": 4096}]) == ContextLimit(4096, None)
    # Without --context-length SGLang reports only max_req_input_len = context - 6 (KV pool not binding).
    assert context_limit([{"context_length": None, "max_req_input_len": 262138}]) == ContextLimit(262144, 262138)
    # Replicas size their KV pools from free memory: the smallest wins.
    replicas = [{"max_req_input_len": 8000}, {"max_req_input_len": 7000}, {"context_length": 9000}]
    assert context_limit(replicas) == ContextLimit(7006, 7000)
    assert context_limit([{"context_length": True, "max_req_input_len": "8"}]) == ContextLimit(None, None)


def test_the_kv_pool_is_named_where_it_not_the_context_bounds_the_answer() -> None:
    """Issue 32 item 3: SGLang caps a request's new tokens to what its KV pool holds beside the prompt
    (engine.limits.memory_cap, SGLang's max_new_tokens_for_memory); such a prompt is set aside naming the pool."""
    # A pool smaller than the context: max_req_input_len = pool - 6, so the derived context is the pool.
    small = context_limit([{"max_req_input_len": 594, "max_total_num_tokens": 600}])
    assert small == ContextLimit(600, 594, 0, 600, 1)
    assert too_long_reason(42, 4096, small) == (
        "42 prompt tokens + max_new_tokens 4096 = 4138 exceeds the server's KV pool of 600 tokens "
        "(max_total_num_tokens in /server_info)"
    )
    # A declared context longer than the pool (--context-length): the context admits it, the pool would cut it.
    declared = context_limit([{"context_length": 8192, "max_req_input_len": 594, "max_total_num_tokens": 1000,
                               "page_size": 64}])  # fmt: skip
    reason = too_long_reason(100, 900, declared) or ""
    assert reason.endswith(
        "the server's KV pool of 1000 tokens (max_total_num_tokens in /server_info, page size 64) holds only 807 "
        "new tokens beside this prompt; SGLang would cut the answer there"
    ), reason
    assert too_long_reason(100, 807, declared) is None  # exactly what the pool holds
    # A pool of several contexts (the usual case) never binds before the context.
    roomy = context_limit([{"max_req_input_len": 262138, "max_total_num_tokens": 900_000}])
    assert too_long_reason(1000, 261144, roomy) is None
    assert "context length of 262144" in (too_long_reason(1000, 261145, roomy) or "")


def test_too_long_is_input_plus_max_new_tokens_above_the_context() -> None:
    limit = ContextLimit(context_length=1000, max_input=None)
    assert too_long_reason(488, 512, limit) is None  # exactly the context: SGLang accepts it
    reason = too_long_reason(489, 512, limit)
    assert reason == (
        "489 prompt tokens + max_new_tokens 512 = 1001 exceeds the server's context length of 1000 tokens"
    )
    # The scheduler's own bound on the input alone.
    assert "fewer than 900" in (too_long_reason(900, 1, ContextLimit(None, 900)) or "")
    assert too_long_reason(899, 1, ContextLimit(None, 900)) is None
    # Nothing known: nothing set aside (the server's 400, if any, is still recorded as a server reject).
    assert too_long_reason(10**9, 10**9, ContextLimit(None, None)) is None


# --- the worker against the simulator -------------------------------------------------------------


@pytest.fixture(scope="module")
def short_context_proxy() -> Iterator[CountingProxy]:
    """A simulator with a 600-token context, behind a counting proxy."""
    with (
        start_sim(*SIM_FLAGS, "--context-length", "600", tokenizer_dir=standin()) as sim,
        CountingProxy(sim.url) as proxy,
    ):
        yield proxy


def test_a_prompt_over_the_context_is_set_aside_unsent_and_stays_so_on_resume(
    tmp_path: Path, short_context_proxy: CountingProxy
) -> None:
    proxy = short_context_proxy
    items = prompts(8, tools_every=0)
    items[3]["messages"][-1]["content"] = "a long question " * 40  # ~130 tokens: 130 + 512 > 600
    dataset = write_dataset(tmp_path / "prompts.jsonl", items)
    output = tmp_path / "out"
    document = spec(dataset, output, **{"generation.samplesPerPrompt": 2, "generation.sampling.max_new_tokens": 512})

    before = len(proxy.generate_lengths)
    assert run_inprocess(document, [proxy.url]) == EXIT_OK
    sent = proxy.generate_lengths[before:]
    # 7 prompts x 2 samples sent; the long one never was (every sent prompt is short).
    assert len(sent) == 14 and max(sent) < 60, sent
    check_records(output, [item for i, item in enumerate(items) if i != 3], samples=2)

    [reject] = list(iter_rejects(output))
    assert (reject["kind"], reject["cause"], reject["id"], reject["line"]) == (
        "too_long",
        "too_long",
        "p0003",
        4,
    )  # 1-based, as the console says
    assert "exceeds the server's context length of 600 tokens" in reject["reason"]
    state = progress(output)
    assert state["state"] == "complete"
    assert state["set_aside"] == {"too_long": 1} and state["dataset_lines"] == 8
    # Counted apart from server errors: records_rejected is what the server_errors check reads.
    assert (state["records_done"], state["records_set_aside"], state["records_rejected"]) == (14, 2, 0)
    assert (state["prompts_done"], state["prompts_total"]) == (8, 8)
    manifest = read_manifest(output)
    assert manifest is not None
    assert manifest["counts"]["too_long_prompts"] == 1 and manifest["counts"]["rejected"] == 0

    # A rerun sends nothing, writes no new reject and reports the same set-aside counts.
    before = len(proxy.generate_lengths)
    assert run_inprocess(document, [proxy.url]) == EXIT_OK
    assert len(proxy.generate_lengths) == before
    assert len(list(iter_rejects(output))) == 1
    again = progress(output)
    assert (again["set_aside"], again["records_set_aside"], again["records_rejected"]) == ({"too_long": 1}, 2, 0)


def test_speculative_draft_slots_count_against_the_context() -> None:
    """EAGLE keeps its draft tokens in the output slots: SGLang counts them as input (engine/limits.py)."""
    info = {
        "context_length": 1000, "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1,
        "speculative_num_steps": 3, "speculative_num_draft_tokens": 4,
    }  # fmt: skip
    limit = context_limit([info, {"context_length": 1000}])
    assert limit == ContextLimit(1000, None, 4)
    assert too_long_reason(484, 512, limit) is None
    assert too_long_reason(485, 512, limit) == (
        "485 prompt tokens + 4 speculative draft slots + max_new_tokens 512 = 1001 exceeds the server's context "
        "length of 1000 tokens"
    )


def test_the_workers_verdict_is_the_speculative_servers_own() -> None:
    """Read from a speculative server's /server_info, the limit refuses exactly what the server refuses."""
    from tests.sim.http import get, post

    flags = ("--context-length", "600", "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "/d")
    with start_sim(*SIM_FLAGS, *flags, tokenizer_dir=standin()) as sim:
        limit = context_limit([get(sim.url, "/server_info").json()])
        assert limit.reserved > 0
        fits = 600 - 512 - limit.reserved
        for prompt_tokens in (fits, fits + 1):
            body = {"input_ids": [100] * prompt_tokens, "sampling_params": {"max_new_tokens": 512}}
            refused = post(sim.url, "/generate", body).status == 400
            assert refused == (too_long_reason(prompt_tokens, 512, limit) is not None), prompt_tokens
