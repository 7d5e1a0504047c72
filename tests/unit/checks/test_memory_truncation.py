"""Issue 32 item 3: SGLang's scheduler caps a request's new tokens to what its KV pool holds beside the prompt
(`max_new_tokens_for_memory`); such an answer ends `length` short of max_new_tokens. It is rightly truncated, but
its fix is memory, not a larger max_new_tokens."""

from __future__ import annotations

from dataclasses import replace

from datagen_operator.api.flags import TRUNCATED, TRUNCATED_BY_MEMORY
from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.checks import record_checks as rc
from datagen_operator.checks.evaluate import TRUNCATION, CheckContext, evaluate

IM_END = 163586
EXPECT = rc.Expectations(
    thinking=False, think_start_ids=(), think_end_id=None, stop_token_ids=frozenset({IM_END}), max_new_tokens=8
)
CTX = CheckContext(False, None, None, None, None, ChecksSpec())


def flags(output_len: int, expect: rc.Expectations = EXPECT) -> frozenset[str]:
    return rc.inspect_record([5], list(range(1, output_len + 1)), {"type": "length", "length": output_len}, output_len,
                             False, expect)  # fmt: skip


def test_a_length_finish_short_of_max_new_tokens_is_the_servers_cap() -> None:
    assert flags(8) == {TRUNCATED}
    assert flags(5) == {TRUNCATED, TRUNCATED_BY_MEMORY}
    assert flags(5, replace(EXPECT, max_new_tokens=None)) == {TRUNCATED}  # not known: not judged
    stop = rc.inspect_record([5], [1, 2, IM_END], {"type": "stop", "matched": IM_END}, 3, False, EXPECT)
    assert stop == frozenset()  # a short answer that stopped is just short


def truncation(counts: Counts):
    return next(c for c in evaluate(counts, CTX) if c.name == TRUNCATION)


def test_the_verdict_names_memory_where_the_pool_cut_the_answers() -> None:
    memory = truncation(Counts(records=100, flags={TRUNCATED: 10, TRUNCATED_BY_MEMORY: 10}))
    assert not memory.passed
    assert memory.verdict.startswith("10/100 outputs ended `length`, 10 of them short of max_new_tokens")
    assert "more KV memory (server.memFractionStatic" in memory.verdict
    assert "raising max_new_tokens cannot help" in memory.verdict and "raise generation" not in memory.verdict
    mixed = truncation(Counts(records=100, flags={TRUNCATED: 10, TRUNCATED_BY_MEMORY: 4}))
    assert "for the others raise generation.sampling.max_new_tokens" in mixed.verdict
    plain = truncation(Counts(records=100, flags={TRUNCATED: 10}))
    assert plain.verdict.endswith("): raise generation.sampling.max_new_tokens") and "KV" not in plain.verdict
