"""The simulator's radix cache, by the behaviour read from SGLang's `mem_cache/radix_cache.py` and the scheduler's
calls (tests/contract/test_radix_cache.py runs SGLang's own tree on the same sequences where torch is at hand)."""

from __future__ import annotations

from datagen_operator.engine.sim.prefix_cache import RadixCache


def served(cache: RadixCache, prompt: list[int], output: list[int]) -> int:
    hold = cache.admit(prompt)
    cache.finish(hold, prompt, output)
    return hold.cached


def test_a_finished_request_leaves_its_prompt_and_output_but_the_last_token() -> None:
    cache = RadixCache(capacity=10_000)
    assert served(cache, list(range(10)), [100, 101, 102]) == 0
    assert cache.total_size == 12
    assert served(cache, [*range(10), 100, 101, 102, 7, 8], [1]) == 12


def test_the_last_prompt_token_is_never_cached() -> None:
    cache = RadixCache(capacity=10_000)
    served(cache, list(range(10)), [5])
    assert served(cache, list(range(10)), [5]) == 9


def test_pages_match_whole() -> None:
    cache = RadixCache(capacity=10_000, page_size=4)
    served(cache, list(range(10)), [100, 101])  # 11 tokens held: 8 in whole pages
    assert cache.total_size == 8
    assert served(cache, [*range(10), 100, 101, 102, 103], [1]) == 8
    assert served(cache, list(range(9)), [1]) == 8  # capped at len-1 = 8, a whole page multiple
    assert served(cache, list(range(8)), [1]) == 4  # capped at 7, rounded down to 4


def test_least_recently_used_leaves_go_first_when_the_pool_is_full() -> None:
    cache = RadixCache(capacity=40)
    a, b, c = [[base + i for i in range(10)] for base in (1000, 2000, 3000)]
    for prompt in (a, b, c):
        served(cache, prompt, [9])  # 10 tokens each: 30 held
    cache.match(a)  # a is used again: b is now the oldest
    served(cache, [4000 + i for i in range(10)], [9])  # 10 owned while it runs + 30 held = 40: fits
    assert cache.total_size == 40
    served(cache, [5000 + i for i in range(10)], [9])  # 50 > 40: the oldest leaf goes
    assert served(cache, a, [9]) == 9 and served(cache, b, [9]) == 0


def test_the_output_is_a_leaf_of_its_own_and_goes_before_its_prompt() -> None:
    cache = RadixCache(capacity=30)
    served(cache, list(range(10)), [100 + i for i in range(11)])  # prompt 10 + output 10 = 20 held
    served(cache, [50 + i for i in range(8)], [1])  # 8 owned while it runs: 20 + 8 fits; 28 held after
    served(cache, [70 + i for i in range(6)], [1])  # 6 more: 34 > 30, the oldest leaf (the first output) goes
    assert served(cache, list(range(10)), [1]) == 9


def test_a_running_request_keeps_its_prefix() -> None:
    cache = RadixCache(capacity=25)
    served(cache, list(range(10)), [1])
    hold = cache.admit([*range(10), 11, 12])  # locks its 10 cached tokens
    served(cache, [50 + i for i in range(12)], [1])  # needs room: only unlocked leaves may go
    assert hold.cached == 10 and cache.match(list(range(10)))[0] == 10
