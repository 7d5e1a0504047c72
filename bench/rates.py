"""How often the rate rule (checks/rates.py) halts a run, when the rolling checks look again and again.

A run of N records whose records are bad with a true probability p is simulated as the rolling checks see it:
its counters are judged every `--every` records from MIN_RECORDS_TO_JUDGE on (more often than any operator
reconcile looks, so the figures are pessimistic). For the rule and for the plain rate (`count/total > limit`,
the rule before issue 32 item 7), the share of runs halted at some look, by the true rate:
at the limit (a halt is a false alarm at best), at half the limit (a false alarm), at twice the limit (a halt is
right; also the median records before it). Then the CPU time of one judgement at 25,000 and 10,000,000 records.

    python bench/rates.py [--quick] [--limit 0.02] [--records 25000] [--runs 2000] [--every 16]
"""

from __future__ import annotations

import sys

# `python bench/NAME.py` puts bench/ first on sys.path, where bench/operator.py would shadow `operator`.
if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)

import argparse
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from datagen_operator.checks.evaluate import MIN_RECORDS_TO_JUDGE
from datagen_operator.checks.rates import judge_rate


def fewest_failing(total: int, limit: float) -> int:
    """The smallest bad count that fails at `total` records (judge_rate is monotone in the count)."""
    lo, hi = 0, total
    while lo < hi:
        mid = (lo + hi) // 2
        if judge_rate(mid, total, limit).passed:
            lo = mid + 1
        else:
            hi = mid
    return lo


def halted(rate: float, looks: np.ndarray, fail_at: np.ndarray, runs: int, seed: int) -> tuple[float, float]:
    """Share of runs halted at some look, and the median records before the halt (nan when none)."""
    rng = np.random.default_rng(seed)
    steps = np.diff(np.concatenate(([0], looks)))
    counts = np.cumsum(rng.binomial(steps, rate, size=(runs, len(looks))), axis=1)
    over = counts >= fail_at
    ever = over.any(axis=1)
    first = looks[over.argmax(axis=1)][ever]
    return float(ever.mean()), float(np.median(first)) if first.size else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2,500 records, 300 runs")
    parser.add_argument("--limit", type=float, default=0.02)
    parser.add_argument("--records", type=int, default=25_000)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--every", type=int, default=16)
    args = parser.parse_args()
    records, runs = (2_500, 300) if args.quick else (args.records, args.runs)
    looks = np.arange(MIN_RECORDS_TO_JUDGE, records + 1, args.every)
    rule = np.array([fewest_failing(int(n), args.limit) for n in looks])
    plain = np.floor(looks * args.limit).astype(int) + 1  # the least count with count/total > limit
    figures: dict[str, str] = {}
    for name, fail_at in (("rule", rule), ("plain", plain)):
        for label, rate in (("at_limit", args.limit), ("at_half", args.limit / 2), ("at_double", args.limit * 2)):
            share, median = halted(rate, looks, fail_at, runs, seed=7)
            figures[f"{name}_halted_{label}"] = f"{share:.3f}"
            if label == "at_double":
                figures[f"{name}_median_records_to_halt_at_double"] = f"{median:.0f}"
    for total in (25_000, 10_000_000):
        start, repeats = time.process_time(), 200
        for _ in range(repeats):
            judge_rate(int(total * args.limit * 1.05), total, args.limit)
        figures[f"judge_us_at_{total}"] = f"{(time.process_time() - start) / repeats * 1e6:.0f}"
    print(
        f"{records} records, {runs} runs, a look every {args.every} records from {MIN_RECORDS_TO_JUDGE}, limit {args.limit}"
    )
    print(" ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
