"""The simulator's own measure of whether its clients keep it busy (engine/sim/occupancy.py,
`--sim-expected-in-flight`), and answers as long as their prompts (`--sim-answer-tokens-per-prompt-token`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import pytest

from datagen_operator.engine.sim.occupancy import Occupancy
from tests.harness.sim import SimServer
from tests.sim.http import generate, get
from tests.sim.prompts import chat_prompt


def test_underfilled_time_counts_from_bulk_start_to_the_last_answer_and_to_the_last_request() -> None:
    o = Occupancy(expected=2)
    o.arrived(0.0)  # one client alone: the ramp, not counted
    o.arrived(1.0)  # bulk start
    o.left(2.0)  # one in flight: underfilled from here
    o.arrived(2.5)  # full again (the last request)
    o.left(4.0)
    o.left(5.0)  # the last answer; the drain from 4.0 is underfilled too
    assert o.bulk_seconds() == 4.0 and o.underfilled_seconds() == pytest.approx(0.5 + 1.0)
    assert o.sending_seconds() == 1.5 and o.sending_underfilled_seconds() == pytest.approx(0.5)
    assert o.idle_slot_seconds() == pytest.approx(1.5) and o.sending_idle_slot_seconds() == pytest.approx(0.5)


def test_clients_that_never_fill_the_server_are_underfilled_all_along() -> None:
    o = Occupancy(expected=4)
    o.arrived(0.0)
    o.arrived(1.0)
    o.left(3.0)
    o.left(4.0)
    assert o.bulk_seconds() == 4.0 and o.underfilled_seconds() == 4.0
    assert o.idle_slot_seconds() == pytest.approx(3 * 1 + 2 * 2 + 3 * 1)  # each missing request counts


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}\{{.*\}} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


def test_the_metrics_say_it(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory(
        "--enable-metrics", "--sim-speed", "gpu", "--sim-ttft-s", "0", "--sim-tokens-per-s", "100",
        "--sim-mean-answer-tokens", "20", "--sim-length-sigma", "0", "--sim-mean-reasoning-tokens", "1",
        "--sim-expected-in-flight", "2",
    )  # fmt: skip
    body = {"input_ids": chat_prompt("busy?", thinking=False), "sampling_params": {"max_new_tokens": 64}}
    threads = [threading.Thread(target=generate, args=(server.url, body)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    generate(server.url, body)  # one alone: underfilled for its whole ~0.2 s
    text = get(server.url, "/metrics").body.decode()
    bulk, under = _gauge(text, "sglang_sim:bulk_seconds"), _gauge(text, "sglang_sim:underfilled_seconds")
    assert 0.35 < bulk < 5 and 0.15 < under < bulk
    assert _gauge(text, "sglang_sim:expected_in_flight") == 2
    assert _gauge(text, "sglang_sim:sending_seconds") <= bulk
    assert under * 0.9 < _gauge(text, "sglang_sim:idle_slot_seconds") <= 2 * under  # one of two slots was empty


def test_answers_grow_with_their_prompts(sim_factory: Callable[..., SimServer]) -> None:
    server = sim_factory("--sim-answer-tokens-per-prompt-token", "2", "--sim-length-sigma", "0")
    lengths = {}
    for words in (1, 60):
        prompt = chat_prompt(" ".join(["word"] * words), thinking=False)
        answer = generate(server.url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096}})
        lengths[len(prompt)] = answer["meta_info"]["completion_tokens"]
    (short, long_) = sorted(lengths)
    assert lengths[long_] > lengths[short] + (long_ - short)  # about 2 answer tokens per prompt token
