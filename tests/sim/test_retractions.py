"""`--sim-retraction-rate`: the simulator reports retracted requests as SGLang 0.5.23 does, in
meta_info.num_retractions (`Req.retraction_count`, copied by tokenizer_manager into every answer's meta_info),
streamed or not; the answer itself is whole (a retraction re-prefills prompt + output, it loses nothing)."""

from __future__ import annotations

from collections.abc import Callable

from tests.harness.sim import SimServer
from tests.sim.conftest import SHORT
from tests.sim.http import generate, post
from tests.sim.prompts import IM_END, chat_prompt

# Greedy: a retracted answer is compared with a plain one of the same prompt.
BODY = {"input_ids": chat_prompt("retract me"), "sampling_params": {"max_new_tokens": 4096, "temperature": 0}}


def test_a_retracted_request_says_so_in_its_meta_info(sim_factory: Callable[..., SimServer]) -> None:
    retracting, plain = sim_factory("--sim-retraction-rate", "1", *SHORT), sim_factory(*SHORT)
    answer = generate(retracting.url, BODY)
    assert answer["meta_info"]["num_retractions"] == 1
    assert answer["output_ids"][-1] == IM_END and answer["meta_info"]["finish_reason"]["type"] == "stop"
    assert answer["output_ids"] == generate(plain.url, BODY)["output_ids"]  # the same answer, whole
    assert generate(plain.url, BODY)["meta_info"]["num_retractions"] == 0
    events = [e for e in post(retracting.url, "/generate", {**BODY, "stream": True}).events() if e != "[DONE]"]
    assert events and all(event["meta_info"]["num_retractions"] == 1 for event in events)
