"""The one rule every stage judges a rate by: a rate check fails only on clear evidence (docs/checks.md).

A rate from a handful of records is noise: 1 truncated answer of 25 is 4 %, yet a model that truncates 2 % of
its answers writes at least one such answer in 40 % of 25-record runs. So a max-rate check fails when the
exact (Clopper-Pearson) one-sided lower confidence bound of the bad rate, at CONFIDENCE, is above the limit:
equivalently, when a process whose true rate is the limit would show this many bad records or more in under
5 % of samples this size. A min-rate check is the same rule on the complement (the bad rate against 1 - the
minimum). A sample where every record failed fails at once, whatever its size, unless the limit allows 100 %.
A limit of 0 keeps its meaning: any bad record fails. Pure functions, no imports beyond `math`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95
"""One-sided: a run whose true rate is exactly the limit fails a single look with at most 5 % chance."""
_ALPHA = 1.0 - CONFIDENCE


@dataclass(frozen=True)
class RateVerdict:
    """`count` bad records out of `total` judged against `limit` (the largest bad rate allowed)."""

    count: int
    total: int
    limit: float
    passed: bool
    bound: float
    """The lower CONFIDENCE bound of the bad rate: the least the true rate can be, given this sample."""

    @property
    def rate(self) -> float:
        return self.count / self.total if self.total else 0.0

    @property
    def every_one(self) -> bool:
        return self.total > 0 and self.count == self.total

    def said(self, noun: str) -> str:
        """The rate, its bound and the sample size in words, for a max-rate check's verdict: '4%; from 25
        outputs that is consistent with the 2% limit: the true rate may be as low as 0.205% at 95% confidence'."""
        rate, limit, n = pct(self.rate), pct(self.limit), f"{self.total} {noun}"
        if self.limit <= 0.0:
            return f"{rate}; the limit is 0" + ("" if self.passed else ": any one fails")
        if self.rate <= self.limit:
            return f"{rate}, within the {limit} limit"
        if self.passed:
            return (
                f"{rate}; from {n} that is consistent with the {limit} limit: the true rate may be as low as "
                f"{pct(self.bound)} at {pct(CONFIDENCE)} confidence"
            )
        if self.every_one:
            return f"every one of the {n}, against a {limit} limit"
        return (
            f"{rate}; from {n} the true rate is at least {pct(self.bound)} at {pct(CONFIDENCE)} confidence, above "
            f"the {limit} limit"
        )

    def said_of_good(self, noun: str) -> str:
        """The same for a min-rate check (judge_min_rate), in the good records' terms: '96%; from 25 outputs that
        is consistent with the 98% minimum: the true rate may be as high as 99.8% at 95% confidence'."""
        good, minimum, n = pct(1.0 - self.rate), pct(1.0 - self.limit), f"{self.total} {noun}"
        if self.limit <= 0.0:
            return f"{good}; the minimum is 100%" + ("" if self.passed else ": any one missing fails")
        if self.rate <= self.limit:
            return f"{good}, meeting the {minimum} minimum"
        if self.passed:
            return (
                f"{good}; from {n} that is consistent with the {minimum} minimum: the true rate may be as high as "
                f"{pct(1.0 - self.bound)} at {pct(CONFIDENCE)} confidence"
            )
        if self.every_one:
            return f"none of the {n}, against a {minimum} minimum"
        return (
            f"{good}; from {n} the true rate is at most {pct(1.0 - self.bound)} at {pct(CONFIDENCE)} confidence, "
            f"below the {minimum} minimum"
        )


def pct(fraction: float) -> str:
    """A rate in percent to three significant figures, never rounded to 0% or 100% when it is neither."""
    value = fraction * 100
    if value <= 0.0 or value >= 100.0:
        return f"{max(0.0, min(100.0, value)):g}%"
    decimals = max(0, 2 - math.floor(math.log10(value)))
    shown = f"{value:.{decimals}f}"
    while decimals < 12 and float(shown) in (0.0, 100.0):
        decimals += 1
        shown = f"{value:.{decimals}f}"
    if "." in shown:
        shown = shown.rstrip("0").rstrip(".")
    return f"{shown}%"


def judge_rate(count: int, total: int, limit: float) -> RateVerdict:
    """Pass unless the sample shows clear evidence that the bad rate is above `limit` (module docstring)."""
    if count < 0 or count > total:
        raise ValueError(f"a rate of {count} out of {total} records: the count must be between 0 and the total")
    bound = lower_bound(count, total)
    if total == 0 or count == 0 or limit >= 1.0:
        passed = True
    elif count == total:
        passed = False  # every record failed: the clearest evidence a sample of any size gives
    else:
        passed = binomial_tail(count, total, limit) >= _ALPHA
    return RateVerdict(count, total, limit, passed, bound)


def judge_min_rate(good: int, total: int, minimum: float) -> RateVerdict:
    """A min-rate check (e.g. reasoning captured): the same rule on the records that miss it."""
    return judge_rate(total - good, total, max(0.0, 1.0 - minimum))


def binomial_tail(count: int, total: int, p: float) -> float:
    """P(X >= count) for X ~ Binomial(total, p): how often a process at rate p shows this many or more."""
    if count <= 0:
        return 1.0
    if count > total or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return _betainc(count, total - count + 1, p)


def lower_bound(count: int, total: int) -> float:
    """The exact one-sided lower CONFIDENCE bound of a binomial rate: the p at which P(X >= count) = 1 - CONFIDENCE
    (0 with no bad record; closed form when every record is bad)."""
    if count <= 0 or total <= 0:
        return 0.0
    if count >= total:
        return float(_ALPHA ** (1.0 / total))
    a, b = count, total - count + 1
    lo, hi = 0.0, count / total  # P(X >= k) at p = k/n is at least 1/2 (the binomial's median is k)
    p = min(max(_wilson_lower(count, total), hi * 1e-6), hi * (1 - 1e-9))
    for _ in range(200):
        f = _betainc(a, b, p) - _ALPHA
        if f > 0:
            hi = p
        else:
            lo = p
        if hi - lo <= 1e-12 * hi:
            break
        # Newton on the incomplete beta (its derivative is the beta density), kept inside the bracket.
        log_density = (a - 1) * math.log(p) + (b - 1) * math.log1p(-p) - _log_beta(a, b)
        step = f / math.exp(log_density) if log_density > -700 else math.inf
        nxt = p - step
        p = nxt if lo < nxt < hi else (lo + hi) / 2
    return p


def _wilson_lower(count: int, total: int) -> float:
    """The Wilson score bound: only a starting point for lower_bound's Newton steps."""
    z = 1.6448536269514722  # the standard normal's 95 % quantile
    phat, z2 = count / total, z * z
    centre = phat + z2 / (2 * total)
    spread = z * math.sqrt(phat * (1 - phat) / total + z2 / (4 * total * total))
    return max(0.0, (centre - spread) / (1 + z2 / total))


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method), on the
    side of x where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - _log_beta(a, b))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    # Converges in O(sqrt(max(a, b))) terms at worst: enough for any record count a run holds.
    for m in range(1, 10_000 + 20 * int(math.sqrt(max(a, b)))):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for numerator in (even, odd):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    return h
