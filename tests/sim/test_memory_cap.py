"""`--sim-kv-capacity`: a KV pool smaller than prompt + max_new_tokens caps each answer as SGLang's scheduler does
(`max_new_tokens_for_memory`, engine.limits.memory_cap): it ends `length` at the cap, short of max_new_tokens,
and `/server_info` reports the pool as max_total_num_tokens."""

from __future__ import annotations

from collections.abc import Callable

from datagen_operator.engine.limits import memory_cap
from tests.harness.sim import SimServer
from tests.sim.http import generate, get
from tests.sim.prompts import chat_prompt

LONG = ("--sim-mean-answer-tokens", "3000", "--sim-mean-reasoning-tokens", "3000")


def test_a_small_pool_caps_the_answer_short_of_max_new_tokens(sim_factory: Callable[..., SimServer]) -> None:
    small = sim_factory("--sim-kv-capacity", "400", *LONG)
    assert get(small.url, "/server_info").json()["max_total_num_tokens"] == 400
    prompt = chat_prompt("a long answer, please")
    answer = generate(small.url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096}})
    cap = memory_cap(len(prompt), 4096, 400)
    assert cap == 400 - len(prompt) - 2
    assert len(answer["output_ids"]) == cap == answer["meta_info"]["completion_tokens"]
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": cap}
    roomy = generate(small.url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 50}})
    assert roomy["meta_info"]["finish_reason"] == {"type": "length", "length": 50}  # under the cap: max_new_tokens
