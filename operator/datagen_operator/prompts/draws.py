"""Seeded draws per dataset line: which lines `dataset.sample` keeps, and which value each variable of
`generation.templateVariableMix` gives a line.

Both hash a line's identity, never its position: the prompt id the output keys records by (the id field's
value, or the id derived from the content), and for a line without a usable id its rejects.jsonl key
(`line:N`). So a draw depends on neither the file's order nor the shard count, and a resume, verify and an
export draw exactly what the run drew.

A line's draw is the big-endian integer of the 8-byte blake2b digest of `<seed> NUL <what> NUL <identity>`
(`what`: `sample`, or the variable's name, so each variable is drawn apart from the subset and the others).

- `dataset.sample`: `fraction: f` keeps a line whose draw is below f * 2**64 (each line apart: about f of the
  lines); `count: N` keeps the N valid prompts with the lowest draws (a pass over the dataset finds the N-th),
  and with them every line set aside whose draw is not above it, so the lines set aside are counted at the
  subset's own rate. A dataset of N valid prompts or fewer is taken whole.
- `generation.templateVariableMix`: a variable's draw, as a fraction of 2**64, picks a choice by the
  cumulative weights, in the order the spec lists them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the spec models load pydantic; a scan without a sample needs none of this
    from datagen_operator.api.generation_spec import DatasetSample, TemplateVariableMix

FULL = 1 << 64
SAMPLE = "sample"
"""The `what` of the subset's draw."""


def line_draw(seed: int, what: str, identity: str) -> int:
    """The line's draw for `what`: an integer in [0, 2**64), uniform over identities."""
    return int.from_bytes(blake2b(f"{seed}\0{what}\0{identity}".encode(), digest_size=8).digest())


@dataclass(frozen=True)
class SubsetRule:
    """Which lines a scan keeps: those whose draw is at most `bound`. `wanted`: a count's N (None: a fraction);
    `prompts`: the dataset's valid prompts when counted (count mode), to say N exceeded them."""

    seed: int
    bound: int
    wanted: int | None = None
    prompts: int | None = None

    def keeps(self, identity: str) -> bool:
        return line_draw(self.seed, SAMPLE, identity) <= self.bound

    @property
    def whole(self) -> bool:
        """Count mode over a dataset of at most N valid prompts: every line is kept."""
        return self.wanted is not None and self.prompts is not None and self.prompts <= self.wanted

    def said(self) -> str:
        """What the subset is, for a person (the preflight's verdict)."""
        if self.wanted is None:
            return f"dataset.sample: a fraction {self.bound / FULL:.4g}, seed {self.seed}"
        if self.whole:
            return (
                f"dataset.sample.count {self.wanted} is not below the dataset's {self.prompts} valid prompts: every "
                "prompt is taken"
            )
        return f"dataset.sample: {self.wanted} of {self.prompts} prompts, seed {self.seed}"


def fraction_rule(sample: DatasetSample) -> SubsetRule:
    assert sample.fraction is not None
    return SubsetRule(sample.seed, min(FULL - 1, int(sample.fraction * FULL) - 1))


def count_rule(sample: DatasetSample, prompt_ids: Iterable[str]) -> SubsetRule:
    """The rule of a count over the dataset's valid prompts (`prompt_ids`: each id once, the whole dataset's)."""
    import numpy as np

    count, seed = sample.count, sample.seed
    assert count is not None
    draws = np.fromiter((line_draw(seed, SAMPLE, prompt_id) for prompt_id in prompt_ids), dtype=np.uint64)
    if len(draws) <= count:
        return SubsetRule(seed, FULL - 1, count, len(draws))
    bound = int(np.partition(draws, count - 1)[count - 1])
    return SubsetRule(seed, bound, count, len(draws))


@dataclass(frozen=True)
class VariableDraws:
    """A templateVariableMix ready to draw: per variable, its values and their cumulative weights."""

    seed: int
    variables: tuple[tuple[str, tuple[Any, ...], tuple[float, ...]], ...]

    @classmethod
    def of(cls, mix: TemplateVariableMix) -> VariableDraws:
        return cls(
            mix.seed,
            tuple(
                (name, tuple(c.value for c in choices), tuple(accumulate(c.weight for c in choices)))
                for name, choices in mix.variables.items()
            ),
        )

    def draw(self, identity: str) -> dict[str, Any]:
        """The line's drawn value of every variable."""
        drawn = {}
        for name, values, cumulative in self.variables:
            at = line_draw(self.seed, name, identity) / FULL * cumulative[-1]
            drawn[name] = values[min(bisect_right(cumulative, at), len(values) - 1)]
        return drawn


def variable_draws(mix: TemplateVariableMix | None) -> VariableDraws | None:
    return VariableDraws.of(mix) if mix is not None else None
