"""Identical samples of one prompt: the rule the canary, the workers (rolling checks) and verify count alike.

SGLang 0.5.23 samples every request anew (`torch.multinomial`); a request's sampling_seed is used only under
--enable-deterministic-inference, which gives an unseeded request seed 42, and a greedy request is the argmax.
So with temperature > 0 the samples of one prompt differ, and a prompt whose samples all came back identical
is the sign of one seed for every sample or a greedy server. Only first turns are compared: a later turn's
prompt holds its sample's own earlier answers. The spec's side of the rule (greedy sampling with
samplesPerPrompt > 1) is refused by api.spec before any server starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from datagen_operator.api.generation_spec import is_greedy
from datagen_operator.api.progress import Counts
from datagen_operator.api.spec import DataGenRunSpec


def samples_compared(sampling: Mapping[str, Any], samples: int) -> int:
    """The samples of each prompt the check compares: all of them when there are two or more and the sampling
    is not greedy, else 0 (`sampling`: the spec's sampling params, or as the data fingerprint keeps them)."""
    return samples if samples > 1 and not is_greedy(sampling.get("temperature"), sampling.get("top_k")) else 0


def compared_samples(spec: DataGenRunSpec) -> int:
    """`samples_compared` for a run's spec."""
    generation = spec.generation
    return samples_compared(generation.sampling.model_dump(exclude_none=True), generation.samples_per_prompt)


class SampleComparison:
    """Counts the prompts whose samples were all identical, as the samples come back (any order, any
    interleaving of prompts). Holds one hash per prompt with samples still to come."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.compared = 0
        self.identical = 0
        self._open: dict[str, tuple[int, int, bool]] = {}
        """prompt id -> (hash of its first sample's output ids, samples seen, all alike so far)"""

    def add(self, prompt_id: str, output: bytes) -> bool | None:
        """One sample's output ids, as bytes (any encoding, the same for every sample of a run). With the
        prompt's last sample, whether its samples were all identical (and counted); else None."""
        digest = hash(output)
        seen = self._open.get(prompt_id)
        if seen is None:
            self._open[prompt_id] = (digest, 1, True)
            return None
        first, count, alike = seen[0], seen[1] + 1, seen[2] and seen[0] == digest
        if count < self.samples:
            self._open[prompt_id] = (first, count, alike)
            return None
        del self._open[prompt_id]
        self._count(alike)
        return alike

    def close(self) -> None:
        """Count the prompts seen with two or more samples but not all of them (a sample refused or failed):
        for a whole pass (verify), not for a worker whose samples are still coming."""
        for _, count, alike in self._open.values():
            if count >= 2:
                self._count(alike)
        self._open.clear()

    def _count(self, alike: bool) -> None:
        self.compared += 1
        self.identical += alike

    def counts(self) -> Counts:
        return Counts(sampled_prompts=self.compared, identical_samples=self.identical)
