"""checks.samples: which runs compare their samples, and the count of prompts whose samples were all alike."""

from __future__ import annotations

from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import ChecksSpec
from datagen_operator.api.status import CheckResult
from datagen_operator.checks.evaluate import IDENTICAL_SAMPLES, CheckContext, record_checks
from datagen_operator.checks.samples import SampleComparison, samples_compared


def test_only_sampled_runs_with_more_than_one_sample_compare() -> None:
    assert samples_compared({"temperature": 0.6}, 4) == 4
    assert samples_compared({}, 2) == 2  # SGLang's default temperature is 1.0
    assert samples_compared({"temperature": 0.6}, 1) == 0
    assert samples_compared({"temperature": 0}, 2) == 0
    assert samples_compared({"temperature": 0.6, "top_k": 1}, 2) == 0


def test_prompts_count_once_their_samples_are_in_whatever_the_order() -> None:
    comparison = SampleComparison(3)
    arrivals = [("a", b"[1,2]"), ("b", b"[5]"), ("a", b"[1,2]"), ("b", b"[6]"), ("c", b"[7]"), ("a", b"[1,2]")]
    results = [comparison.add(prompt, output) for prompt, output in arrivals]
    assert results == [None, None, None, None, None, True]
    assert comparison.add("b", b"[5]") is False
    assert (comparison.compared, comparison.identical) == (2, 1)
    comparison.add("c", b"[7]")  # two of three: counted by close (a third sample refused), alike
    comparison.close()
    assert comparison.counts() == Counts(sampled_prompts=3, identical_samples=2)


def test_the_check_fails_when_the_samples_are_alike_beyond_the_threshold() -> None:
    ctx = CheckContext(False, None, None, None, None, ChecksSpec())

    def judged(identical: int, compared: int) -> CheckResult:
        counts = Counts(records=2 * compared, sampled_prompts=compared, identical_samples=identical)
        return next(c for c in record_checks(counts, ctx) if c.name == IDENTICAL_SAMPLES)

    every = judged(20, 20)
    assert not every.passed and every.verdict.startswith("20/20 prompts got identical samples")
    assert "generation.sampling.sampling_seed" in every.verdict and "temperature above 0" in every.verdict
    assert judged(3, 20).passed  # short answers may coincide: below the 50 % default
    nothing = judged(0, 0)
    assert nothing.passed and nothing.total == 0
