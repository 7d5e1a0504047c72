"""checks.rates: the one rule every stage judges a rate by. A small sample halts only on clear evidence (the exact
95 % lower bound of its bad rate above the limit), every record failed halts at once, and at 25,000 records the
verdict is within 0.15 points of the plain rate."""

from __future__ import annotations

import math

import pytest

from datagen_operator.checks.rates import binomial_tail, judge_min_rate, judge_rate, lower_bound, pct


def exact_tail(count: int, total: int, p: float) -> float:
    return math.fsum(math.comb(total, i) * p**i * (1 - p) ** (total - i) for i in range(count, total + 1))


@pytest.mark.parametrize("total", [1, 2, 11, 25, 250])
def test_the_tail_is_the_binomial_sum(total: int) -> None:
    for count in range(total + 1):
        for p in (0.001, 0.02, 0.1, 0.5, 0.97):
            assert binomial_tail(count, total, p) == pytest.approx(exact_tail(count, total, p), rel=1e-9, abs=1e-200)


@pytest.mark.parametrize(("count", "total"), [(1, 25), (2, 25), (9, 250), (525, 25_000), (20_000, 1_000_000)])
def test_the_bound_is_where_a_process_would_show_this_many_one_time_in_twenty(count: int, total: int) -> None:
    bound = lower_bound(count, total)
    assert 0 < bound < count / total
    assert binomial_tail(count, total, bound) == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize(
    ("total", "count", "passed"),
    [
        (11, 1, True),  # the canary's 11 records
        (11, 2, False),
        # The run: 1 of 25 answers hit max_new_tokens (4 %) against maxTruncationRate 2 %.
        (25, 1, True),
        (25, 2, True),  # 8 %: a 2 % process shows 2 or more of 25 in 9 % of runs
        (25, 3, False),  # 12 %: in 1.3 % of runs
        (250, 9, True),  # 3.6 %
        (250, 10, False),  # 4 %
        (25_000, 525, True),  # 2.1 %: within what 25,000 answers can tell from 2 %
        (25_000, 537, True),  # 2.148 %
        (25_000, 538, False),  # 2.152 %: the bound (2.003 %) is over the limit
    ],
)
def test_a_two_percent_limit_at_25_250_and_25000_records(total: int, count: int, passed: bool) -> None:
    verdict = judge_rate(count, total, 0.02)
    assert verdict.passed is passed
    assert (verdict.bound > 0.02) is not passed  # the verdict is the bound against the limit


@pytest.mark.parametrize("total", [1, 2, 16, 25, 250, 25_000])
def test_every_record_failed_fails_at_once_whatever_the_limit_short_of_all(total: int) -> None:
    for limit in (0.0, 0.02, 0.5, 0.99):
        assert not judge_rate(total, total, limit).passed
        assert not judge_min_rate(0, total, 1 - limit).passed
    assert judge_rate(total, total, 1.0).passed  # a limit of 100 % allows it (the canary's forgiven truncation)


def test_a_zero_limit_fails_on_any_one() -> None:
    assert not judge_rate(1, 25_000, 0.0).passed and judge_rate(0, 25_000, 0.0).passed
    assert not judge_min_rate(24_999, 25_000, 1.0).passed and judge_min_rate(25_000, 25_000, 1.0).passed


def test_no_records_pass() -> None:
    assert judge_rate(0, 0, 0.0).passed and judge_min_rate(0, 0, 0.98).passed


def test_a_minimum_is_the_same_rule_on_the_records_that_miss_it() -> None:
    for total, bad in ((25, 1), (25, 3), (250, 10), (25_000, 538)):
        assert judge_min_rate(total - bad, total, 0.98).passed == judge_rate(bad, total, 0.02).passed


def test_the_words_say_the_rate_the_bound_and_the_sample() -> None:
    assert judge_rate(1, 25, 0.02).said("answers") == (
        "4%; from 25 answers that is consistent with the 2% limit: the true rate may be as low as 0.205% at 95% "
        "confidence"
    )
    assert judge_rate(3, 25, 0.02).said("answers") == (
        "12%; from 25 answers the true rate is at least 3.35% at 95% confidence, above the 2% limit"
    )
    assert judge_rate(0, 25, 0.02).said("answers") == "0%, within the 2% limit"
    assert judge_rate(16, 16, 0.02).said("answers") == "every one of the 16 answers, against a 2% limit"
    assert judge_rate(1, 25, 0.0).said("answers") == "4%; the limit is 0: any one fails"
    assert judge_min_rate(24, 25, 0.98).said_of_good("outputs") == (
        "96%; from 25 outputs that is consistent with the 98% minimum: the true rate may be as high as 99.8% at 95% "
        "confidence"
    )
    assert judge_min_rate(19, 25, 0.98).said_of_good("outputs") == (
        "76%; from 25 outputs the true rate is at most 89% at 95% confidence, below the 98% minimum"
    )


def test_percent_never_rounds_to_none_or_all() -> None:
    assert [pct(x) for x in (0.0, 0.04, 0.02152, 0.9999, 1e-7, 1.0)] == [
        "0%",
        "4%",
        "2.15%",
        "99.99%",
        "0.00001%",
        "100%",
    ]
