"""The output volume's room, pure: what the rest of a run writes (every record its plan counts, less what the
output holds), sized per record on the dataset's own rendered tokens through the worker's segment encoder and the
Parquet writer, and whether the free space holds it: refused when even the least does not fit (every answer one
token), a warning when the most does not (every answer at max_new_tokens). steps/preflight.py measures the free
space and calls these."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from datagen_operator.api.spec import DataGenRunSpec
from datagen_operator.output.layout import FILE_BLOCK, bookkeeping_bytes


class RenderedLines(Protocol):
    """What the estimate reads of the preflight's pass over the dataset (checks/render_pass.py DatasetLines)."""

    @property
    def turns(self) -> int:
        """Records per sample, as the workers' plan counts them."""

    @property
    def sample(self) -> list[list[int]]:
        """Rendered prompts, a uniform sample."""

    @property
    def mean_prompt_tokens(self) -> float: ...

    @property
    def rendered_tokens(self) -> int: ...

    @property
    def lines_total(self) -> int: ...


def planned_records(spec: DataGenRunSpec, lines: RenderedLines) -> int:
    """Every record the run writes, as the workers' plan counts them: a sample of each planned turn (one per
    prompt with turns last), set-aside prompts too."""
    return lines.turns * spec.generation.samples_per_prompt


def records_done(manifest: dict[str, Any] | None) -> int:
    """The records an output's manifest counts as written for good: made, refused, or set aside."""
    counts = (manifest or {}).get("counts") or {}
    return sum(int(counts.get(key) or 0) for key in ("records", "rejected", "set_aside_records"))


MEASURE_TOKENS = 512
"""Output length of the long synthetic records (bytes per output token is the slope between 1 and this)."""


@dataclass(frozen=True)
class OutputEstimate:
    """What the rest of the run writes, per record, measured on this dataset's tokens."""

    records: int
    """Records still to write (planned_records, less what the output already holds: records_done)."""
    shards: int
    min_tokens: int
    """Output tokens of the shortest answer (1, or min_new_tokens)."""
    max_tokens: int
    segment_min: float
    """Segment bytes of a record of mean prompt length and min_tokens."""
    segment_per_token: float
    """Segment bytes of each further output token."""
    parquet_min: float
    parquet_per_token: float
    mean_prompt_tokens: float
    files: int = 0
    """The run's small files written after this check (manifest, dataset pin), a block each at least."""

    @property
    def bytes_per_output_token(self) -> float:
        return self.segment_per_token

    def _peak(self, tokens: int) -> int:
        """The most on disk at once: every segment plus the shards' reserves at the end of generation, or
        every segment plus the Parquet while compacting (the reserve is freed for it)."""
        from datagen_operator.output.writer import RESERVE_BYTES

        extra = tokens - self.min_tokens
        segments = self.records * (self.segment_min + extra * self.segment_per_token)
        parquet = self.records * (self.parquet_min + extra * self.parquet_per_token)
        return int(segments + max(self.shards * RESERVE_BYTES, parquet)) + self.files

    @property
    def lower(self) -> int:
        return self._peak(self.min_tokens)

    @property
    def upper(self) -> int:
        return self._peak(self.max_tokens)


def _record_bytes(input_ids: list[int], outputs: list[list[int]]) -> tuple[float, float]:
    """Mean (segment line bytes, Parquet row bytes) of records as the worker stores them, one per output
    (a batch: one Parquet row alone would be all file overhead, and equal rows would compress to nothing)."""
    import pyarrow.parquet as pq

    from datagen_operator.output.parquet import PARQUET_WRITE_OPTIONS, ColumnBatch
    from datagen_operator.output.records import Answer, build_record, encode_record
    from datagen_operator.prompts.job import Job

    segment = 0
    batch = ColumnBatch()
    for index, output_ids in enumerate(outputs):
        meta = {"finish_reason": {"type": "stop", "matched": output_ids[-1]}, "prompt_tokens": len(input_ids),
                "completion_tokens": len(output_ids), "cached_tokens": 0}  # fmt: skip
        job = Job(index, f"prompt-{index:09d}", 0, input_ids, False, 2**63 + index)
        answer = Answer(output_ids, meta, "http://10.0.0.1:30000", 1, 12.3456)
        record = build_record(job, answer, frozenset(), "5f1c2b9e-7a41-4d2e-9c3b-1e8f0a6d4c27")  # a run UID
        segment += len(encode_record(record))
        batch.add(record)
    buffer = io.BytesIO()
    pq.write_table(batch.table(), buffer, **PARQUET_WRITE_OPTIONS)
    return segment / len(outputs), len(buffer.getvalue()) / len(outputs)


def estimate_output(spec: DataGenRunSpec, lines: RenderedLines, manifest: dict[str, Any] | None) -> OutputEstimate:
    """Synthetic records made of the dataset's own rendered prompts (a sample of the pass's, output ids drawn from
    the same mix), measured with the worker's encoder and the Parquet writer, sized at the mean prompt length."""
    rendered = [ids for ids in lines.sample if ids] or [[0]]
    pool = [token for ids in rendered for token in ids]
    mean_prompt = lines.mean_prompt_tokens or sum(map(len, rendered)) / len(rendered)
    prompt_ids = min(rendered, key=lambda ids: abs(len(ids) - mean_prompt))
    sampling = spec.generation.sampling
    min_tokens = max(1, sampling.min_new_tokens or 1)
    rng = random.Random(0)
    rows = 32
    short = _record_bytes(prompt_ids, [rng.choices(pool, k=min_tokens) for _ in range(rows)])
    long = _record_bytes(prompt_ids, [rng.choices(pool, k=min_tokens + MEASURE_TOKENS) for _ in range(rows)])
    segment_per_token = (long[0] - short[0]) / MEASURE_TOKENS
    parquet_per_token = (long[1] - short[1]) / MEASURE_TOKENS
    # The records are sized at the mean prompt length, not the chosen prompt's.
    offset = mean_prompt - len(prompt_ids)
    return OutputEstimate(
        records=max(0, planned_records(spec, lines) - records_done(manifest)),
        shards=spec.clients.shards,
        min_tokens=min_tokens,
        max_tokens=max(min_tokens, sampling.max_new_tokens),
        segment_min=max(1.0, short[0] + offset * segment_per_token),
        segment_per_token=segment_per_token,
        parquet_min=max(1.0, short[1] + offset * parquet_per_token),
        parquet_per_token=parquet_per_token,
        mean_prompt_tokens=mean_prompt,
        files=bookkeeping_bytes(lines.lines_total) + rendered_bytes(lines),
    )


def rendered_bytes(lines: RenderedLines) -> int:
    """What the rendered store takes on the output volume (output/rendered.py): part of the output, so part of
    its room."""
    from datagen_operator.output.rendered import LINE_DTYPE

    return 4 * lines.rendered_tokens + LINE_DTYPE.itemsize * lines.lines_total + FILE_BLOCK


@dataclass(frozen=True)
class RoomVerdict:
    passed: bool
    message: str


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def room_verdict(estimate: OutputEstimate, output: Path, free: int | None) -> RoomVerdict:
    """Refuse when even the least the rest of the run writes cannot fit; warn when the most cannot."""
    if free is None or estimate.records == 0:
        return RoomVerdict(True, "")
    e = estimate
    basis = (
        f"{e.records} records x ({e.mean_prompt_tokens:.0f} prompt + {e.min_tokens}..{e.max_tokens} output tokens), at "
        f"{e.segment_per_token:.1f} bytes per token in segments, {e.parquet_per_token:.1f} in Parquet"
    )
    if free < e.lower:
        return RoomVerdict(
            False,
            f"{output} has {_size(free)} free; the output needs at least {_size(e.lower)} and up to {_size(e.upper)} "
            f"({basis}). Free space or grow the volume, or write to a larger spec.output.path",
        )
    if free < e.upper:
        return RoomVerdict(
            True,
            f"warning: {output} has {_size(free)} free; the output needs {_size(e.lower)} to {_size(e.upper)} "
            f"({basis}): it may fill up (the run then stops and resumes once the volume grows)",
        )
    return RoomVerdict(True, f"{output} has {_size(free)} free for at most {_size(e.upper)} of output")
