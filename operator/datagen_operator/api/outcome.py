"""A one-shot step's verdict (preflight, parser verification, canary, final verification, export).

The steps run in other processes (a Job's pod, a child of `datagen run`) and hand their verdict back as
JSON: in a cluster as the container's termination message, which Kubernetes keeps to 4096 bytes. The
encoding always fits and always parses: long texts are cut with a marker, then passed checks are dropped,
never `passed`, `reason` or a failed check's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from datagen_operator.api.status import CheckResult

TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a container's termination message."""
_TEXT_WIDTHS = (None, 2048, 1024, 512, 256, 128, 64, 32, 0)
"""Characters kept of the message (check verdicts get half), tried in turn until the verdict fits."""


@dataclass(frozen=True)
class StepOutcome:
    passed: bool
    reason: str
    message: str
    checks: tuple[CheckResult, ...] = ()
    prompts: int | None = None
    """The dataset's valid prompts, where the step counted them (a passed preflight): the run's progress total
    from the start, before any worker has read the dataset."""
    turns: int | None = None
    """With the prompts: the answers the dataset plans per sample (generation.turns all: every conversation's
    planned turns; one a line otherwise), the run's total in records per sample."""
    complete: bool = False
    """A passed preflight over an output that already holds every record the spec asks for (every shard done):
    nothing is left to generate, so the run goes to the final verification without a server."""
    recorded: int | None = None
    """With the prompts: the records the output already held (a resume), done from the start: the progress never
    shows less while the workers, starting, have not counted them yet."""
    concurrency: int | None = None
    """A passed canary of a `clients.concurrency: auto` run: the requests in flight per shard it sized from the
    servers' batch limits (checks/batch_fill.auto_concurrency). The workers send at it, a resume too."""

    def for_storage(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> bytes:
        """Compact JSON of at most `limit` bytes that `from_storage` reads back to the same verdict."""
        failed = tuple(c for c in self.checks if not c.passed)
        for checks in (self.checks, failed):
            for width in _TEXT_WIDTHS:
                data = self._encode(checks, width)
                if len(data) <= limit:
                    return data
        kept = list(failed)  # more failed checks than fit even without words: keep the first ones
        while kept:
            kept.pop()
            data = self._encode(tuple(kept), 0)
            if len(data) <= limit:
                return data
        return self._encode((), 0, reason_width=limit // 4)

    @classmethod
    def from_storage(cls, data: bytes | str) -> StepOutcome:
        """Raises orjson.JSONDecodeError, KeyError or ValueError when `data` is not a verdict."""
        body = orjson.loads(data)
        checks = tuple(CheckResult.model_validate(c) for c in body.get("checks", []))
        prompts, turns, recorded = body.get("prompts"), body.get("turns"), body.get("recorded")
        concurrency = body.get("concurrency")
        return cls(
            bool(body["passed"]),
            str(body["reason"]),
            str(body["message"]),
            checks,
            None if prompts is None else int(prompts),
            None if turns is None else int(turns),
            bool(body.get("complete", False)),
            None if recorded is None else int(recorded),
            None if concurrency is None else int(concurrency),
        )

    def _encode(self, checks: tuple[CheckResult, ...], width: int | None, *, reason_width: int | None = None) -> bytes:
        half = None if width is None else width // 2
        body: dict[str, Any] = {
            "passed": self.passed,
            "reason": cut_text(self.reason, reason_width),
            "message": cut_text(self.message, width),
            "checks": [
                {
                    **c.model_dump(mode="json", exclude_defaults=True),
                    **({"verdict": cut_text(c.verdict, half)} if c.verdict else {}),
                }
                for c in checks
            ],
        }
        if len(checks) < len(self.checks):
            body["checksOmitted"] = len(self.checks) - len(checks)
        if self.prompts is not None:
            body["prompts"] = self.prompts
        if self.turns is not None:
            body["turns"] = self.turns
        if self.complete:
            body["complete"] = True
        if self.recorded is not None:
            body["recorded"] = self.recorded
        if self.concurrency is not None:
            body["concurrency"] = self.concurrency
        return orjson.dumps(body)


def cut_text(text: str, width: int | None) -> str:
    """`text`, or its first `width` characters and how many were cut (never a byte cut inside a character)."""
    if width is None or len(text) <= width:
        return text
    return f"{text[:width]}… [{len(text) - width} more characters]"
