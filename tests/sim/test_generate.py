"""POST /generate against the simulator, as SGLang 0.5.23 answers it (docs/sglang-fidelity.md)."""

from __future__ import annotations

import statistics

import pytest

from tests.harness.sim import SimServer
from tests.sim.http import generate, post
from tests.sim.prompts import IM_END, THINK, THINK_END, WEATHER_TOOL, chat_prompt, decode, encode

TOOL_SECTION_BEGIN, TOOL_SECTION_END = 163595, 163596


def one(sim: SimServer, prompt: list[int], **params: object) -> dict:
    return generate(sim.url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4096, **params}})


# -- the token stream ---------------------------------------------------------------------------


def test_thinking_prompt_gets_reasoning_then_close_then_answer_then_im_end(sim: SimServer) -> None:
    result = one(sim, chat_prompt(thinking=True))
    ids = result["output_ids"]
    assert THINK not in ids, "the opener is the last prompt token, not an output token"
    assert ids.count(THINK_END) == 1
    assert 0 < ids.index(THINK_END) < len(ids) - 2, "reasoning before </think>, an answer after it"
    assert ids[-1] == IM_END and ids.count(IM_END) == 1
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert len(ids) == result["meta_info"]["completion_tokens"]


def test_thinking_off_prompt_gets_the_answer_directly(sim: SimServer) -> None:
    prompt = chat_prompt(thinking=False)
    assert prompt[-2:] == [THINK, THINK_END]
    ids = one(sim, prompt)["output_ids"]
    assert THINK not in ids and THINK_END not in ids
    assert ids[-1] == IM_END and len(ids) > 1


def test_prompt_without_think_tail_gets_the_model_opening_think_itself(sim: SimServer) -> None:
    ids = one(sim, encode("Hello there"))["output_ids"]
    assert ids[0] == THINK and ids.count(THINK_END) == 1 and ids[-1] == IM_END


def test_declared_tools_get_a_kimi_tool_call_section(sim: SimServer) -> None:
    ids = one(sim, chat_prompt("Weather in Paris?", tools=[WEATHER_TOOL]))["output_ids"]
    begin = ids.index(TOOL_SECTION_BEGIN)
    assert ids.index(THINK_END) < begin < ids.index(TOOL_SECTION_END) == len(ids) - 2
    section = decode(ids[begin:-1], skip_special_tokens=False)
    assert section.startswith("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0")
    assert '<|tool_call_argument_begin|>{"city": ' in section
    assert section.endswith("<|tool_call_end|><|tool_calls_section_end|>")


def test_no_tool_section_without_declared_tools(sim: SimServer) -> None:
    for question in ("a", "b", "c", "d"):
        assert TOOL_SECTION_BEGIN not in one(sim, chat_prompt(question))["output_ids"]


def test_each_sampled_request_is_drawn_anew_and_greedy_ones_alike(sim: SimServer) -> None:
    """SGLang 0.5.23 without --enable-deterministic-inference: `torch.multinomial` draws every sampled request
    anew and the sampling batch drops sampling_seed (sampling_batch_info.py); greedy is the argmax."""
    prompt = chat_prompt("determinism")
    drawn = [one(sim, prompt)["output_ids"] for _ in range(4)]
    assert len({tuple(ids) for ids in drawn}) == 4, "samples of one prompt differ"
    seeded = [one(sim, prompt, sampling_seed=1)["output_ids"] for _ in range(2)]
    assert seeded[0] != seeded[1], "the seed is ignored without --enable-deterministic-inference"
    for greedy in ({"temperature": 0}, {"temperature": 0.7, "top_k": 1}):
        first, again = one(sim, prompt, **greedy), one(sim, prompt, **greedy)
        assert first["output_ids"] == again["output_ids"] and first["text"] == again["text"]


def test_answer_lengths_follow_the_configured_mean(sim: SimServer) -> None:
    # The session simulator runs with --sim-mean-answer-tokens 60 and the default lognormal sigma 0.6.
    lengths = [len(one(sim, chat_prompt(f"q{index}", thinking=False))["output_ids"]) - 1 for index in range(150)]
    assert 48 < statistics.mean(lengths) < 72
    assert min(lengths) < 35 and max(lengths) > 100, "lognormal: a spread, not a constant"


# -- text ---------------------------------------------------------------------------------------


def test_text_is_the_decoded_output_without_special_tokens(sim: SimServer) -> None:
    result = one(sim, chat_prompt())
    assert result["text"] == decode(result["output_ids"])
    assert "</think>" in result["text"], "</think> is not a special token"
    assert "<|im_end|>" not in result["text"]


def test_skip_special_tokens_false_keeps_special_tokens_but_trims_the_matched_stop(sim: SimServer) -> None:
    prompt = chat_prompt()
    kept = one(sim, prompt, skip_special_tokens=False)
    assert kept["text"] == decode(kept["output_ids"][:-1], skip_special_tokens=False)
    untrimmed = one(sim, prompt, skip_special_tokens=False, no_stop_trim=True)
    assert untrimmed["text"].endswith("<|im_end|>")


def test_text_prompt_is_tokenized(sim: SimServer) -> None:
    text = "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    # Greedy: the two requests of one prompt are answered alike.
    by_text = generate(sim.url, {"text": text, "sampling_params": {"max_new_tokens": 4096, "temperature": 0}})
    assert by_text["output_ids"] == one(sim, encode(text), temperature=0)["output_ids"]
    assert by_text["meta_info"]["prompt_tokens"] == len(encode(text))


# -- finish reasons and limits ------------------------------------------------------------------


def test_max_new_tokens_defaults_to_128(sim: SimServer) -> None:
    result = generate(sim.url, {"input_ids": chat_prompt(thinking=False), "sampling_params": {"ignore_eos": True}})
    assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
    assert len(result["output_ids"]) == result["meta_info"]["completion_tokens"] == 128


def test_length_finish(sim: SimServer) -> None:
    result = one(sim, chat_prompt(), max_new_tokens=5)
    assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(result["output_ids"]) == 5 and IM_END not in result["output_ids"]


def test_stop_exactly_at_max_new_tokens_is_a_stop_as_sglang_checks_stops_first(sim: SimServer) -> None:
    """`Req.update_finish_state` checks stop strings, then stop tokens, then the length (contract:
    tests/contract/test_sim_finish.py)."""
    natural = one(sim, chat_prompt("exact"), temperature=0)["output_ids"]  # greedy: each request alike
    cut = one(sim, chat_prompt("exact"), max_new_tokens=len(natural), temperature=0)
    assert cut["output_ids"] == natural
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": natural[-1]}
    shorter = one(sim, chat_prompt("exact"), max_new_tokens=len(natural) - 1, temperature=0)
    assert shorter["meta_info"]["finish_reason"] == {"type": "length", "length": len(natural) - 1}
    word = natural[len(natural) // 2]
    at_cap = one(
        sim, chat_prompt("exact"), max_new_tokens=natural.index(word) + 1, stop_token_ids=[word], temperature=0
    )
    assert at_cap["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}


def test_stop_token_ids(sim: SimServer) -> None:
    result = one(sim, chat_prompt(), stop_token_ids=[THINK_END])
    assert result["output_ids"][-1] == THINK_END
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": THINK_END}
    assert "</think>" not in result["text"], "the matched stop is trimmed from text"
    assert one(sim, chat_prompt(), stop_token_ids=[THINK_END], no_stop_trim=True)["text"].endswith("</think>")


def test_stop_string(sim: SimServer) -> None:
    full = one(sim, chat_prompt("stop string"), temperature=0)  # greedy: each request alike
    word = full["text"].split()[3]
    result = one(sim, chat_prompt("stop string"), stop=[word], temperature=0)
    assert result["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert result["text"] == full["text"][: full["text"].index(word)]
    assert full["output_ids"][: len(result["output_ids"])] == result["output_ids"]
    assert word in decode(result["output_ids"]) and word not in decode(result["output_ids"][:-1])


def test_ignore_eos_runs_to_max_new_tokens(sim: SimServer) -> None:
    result = one(sim, chat_prompt(thinking=False), ignore_eos=True, max_new_tokens=400)
    assert result["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    assert len(result["output_ids"]) == 400 and IM_END in result["output_ids"][:-1]


def test_min_new_tokens_delays_the_stop(sim: SimServer) -> None:
    result = one(sim, chat_prompt(thinking=False), min_new_tokens=300)
    assert len(result["output_ids"]) >= 300 and result["output_ids"][-1] == IM_END


def test_context_length_limits_prompt_and_output(sim: SimServer) -> None:
    context = 262_144  # the stand-in's max_position_embeddings
    body = {"input_ids": [100] * (context - 24), "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}
    # Admitted (prompt + max_new_tokens fit), then capped by the scheduler two tokens short of the context.
    assert generate(sim.url, body)["meta_info"]["finish_reason"] == {"type": "length", "length": 22}
    over = post(sim.url, "/generate", {**body, "sampling_params": {"max_new_tokens": 25}})  # refused, not shortened
    assert over.status == 400 and "exceeds the model's maximum context length" in over.json()["error"]["message"]
    too_long = post(sim.url, "/generate", {"input_ids": [100] * context})
    assert too_long.status == 400 and "context length" in too_long.json()["error"]["message"]


# -- request shapes -----------------------------------------------------------------------------


def test_meta_info_fields(sim: SimServer) -> None:
    meta = one(sim, chat_prompt(), max_new_tokens=3)["meta_info"]
    assert set(meta) == {
        "id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
        "weight_version", "num_retractions", "e2e_latency",
    }  # fmt: skip
    assert meta["prompt_tokens"] == len(chat_prompt()) and meta["reasoning_tokens"] == 0
    assert isinstance(meta["e2e_latency"], float) and meta["num_retractions"] == 0


def test_repeated_prompt_reports_cached_tokens(sim: SimServer) -> None:
    prompt = encode("cache me " * 100)
    first = one(sim, prompt, max_new_tokens=1)["meta_info"]["cached_tokens"]
    second = one(sim, prompt, max_new_tokens=1)["meta_info"]["cached_tokens"]
    assert first == 0 and second == len(prompt) - 1  # SGLang always computes the last prompt token


def test_next_turn_reports_the_previous_prompt_and_answer_cached(sim: SimServer) -> None:
    """SGLang inserts a finished request's prompt and output (all but the last sampled token, whose KV was never
    computed), so the next turn of a conversation finds both."""
    prompt = encode("the first turn of a conversation nobody else has " * 10)
    output = one(sim, prompt, max_new_tokens=30)["output_ids"]
    next_turn = prompt + output + encode(" and the user answers back")
    cached = one(sim, next_turn, max_new_tokens=1)["meta_info"]["cached_tokens"]
    assert len(output) > 1 and cached == len(prompt) + len(output) - 1


def test_batch_answers_an_array_in_order_with_rid_suffixes(sim: SimServer) -> None:
    prompts = [chat_prompt(f"batch {index}") for index in range(3)]
    singles = [one(sim, prompt, max_new_tokens=50, temperature=0)["output_ids"] for prompt in prompts]  # greedy
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 50, "temperature": 0}, "rid": "job"}
    results = generate(sim.url, body)
    assert isinstance(results, list) and len(results) == 3
    assert [result["output_ids"] for result in results] == singles
    assert [result["meta_info"]["id"] for result in results] == ["job_0", "job_1", "job_2"]


def test_batch_with_per_prompt_sampling_params(sim: SimServer) -> None:
    body = {
        "input_ids": [chat_prompt("a"), chat_prompt("b")],
        "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3}],
    }
    assert [len(result["output_ids"]) for result in generate(sim.url, body)] == [2, 3]


def test_single_rid_is_kept(sim: SimServer) -> None:
    body = {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 1}, "rid": "mine"}
    assert generate(sim.url, body)["meta_info"]["id"] == "mine"


def test_n_samples_answer_a_list_of_distinct_samples(sim: SimServer) -> None:
    results = generate(sim.url, {"input_ids": chat_prompt(), "sampling_params": {"max_new_tokens": 4096, "n": 2}})
    assert len(results) == 2 and results[0]["output_ids"] != results[1]["output_ids"]


def test_return_logprob_and_prompt_token_ids(sim: SimServer) -> None:
    prompt = chat_prompt()
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}, "return_logprob": True,
            "return_prompt_token_ids": True}  # fmt: skip
    result = generate(sim.url, body)
    assert result["prompt_token_ids"] == prompt
    logprobs = result["meta_info"]["output_token_logprobs"]
    assert [entry[1] for entry in logprobs] == result["output_ids"] and all(entry[0] <= 0 for entry in logprobs)
    assert len(result["meta_info"]["input_token_logprobs"]) == len(prompt)


# -- strict validation (HTTP 400 body shapes) ---------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": 8},
        {"max_new_tokens": 8, "max_completion_tokens": 8},
        {"max_new_tokens": 8.0},
        {"max_new_tokens": "8"},
        {"stop_token_ids": "x"},
    ],
    ids=["openai-max_tokens", "unknown-key", "float-max_new_tokens", "string-max_new_tokens", "string-stop_token_ids"],
)
def test_flat_400_for_unknown_key_or_float_max_new_tokens(sim: SimServer, params: dict) -> None:
    reply = post(sim.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": params})
    assert reply.status == 400
    assert isinstance(reply.json()["error"], str) and reply.json()["error"]


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}},
        {"input_ids": [1, 2], "sampling_params": {"temperature": -0.5}},
        {"input_ids": [1, 2], "sampling_params": {"top_p": 0}},
        {"input_ids": [1, 2], "sampling_params": {"top_k": 0}},
        {"input_ids": [1, 2], "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 8}},
        {"input_ids": []},
        {"input_ids": [1, -2]},
        {"input_ids": [1, 163840]},
        {"sampling_params": {}},
        {"input_ids": [[1], [2]], "sampling_params": [{}]},
    ],
)
def test_nested_400_for_other_invalid_requests(sim: SimServer, body: dict) -> None:
    reply = post(sim.url, "/generate", body)
    assert reply.status == 400, reply.body
    assert isinstance(reply.json()["error"]["message"], str)


def test_invalid_json_is_a_400(sim: SimServer) -> None:
    reply = post(sim.url, "/generate", b"{not json")
    assert reply.status == 400 and "message" in reply.json()["error"]
