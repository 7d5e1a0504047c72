"""Start-up before generation, as steps that each hand back what they found: the dataset held to its pin, the
servers met (their fingerprint, context limit, whether to stream), the data fingerprint, the shard's files
claimed and recovered."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import Reason
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.engine.limits import ContextLimit, context_limit
from datagen_operator.output.fingerprint import (
    build_fingerprint,
    diff_fingerprints,
    fingerprint_sha256,
    server_fingerprint,
    tokenizer_fingerprint,
)
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.writer import RecoveryReport, ShardWriter, remove_stale_temporaries
from datagen_operator.prompts.dataset_ref import DatasetError
from datagen_operator.worker.config import BadInput, FingerprintMismatch, WorkerConfig
from datagen_operator.worker.inputs import Inputs
from datagen_operator.worker.servers import server_infos
from datagen_operator.worker.shard_files import claim_output, keep_run_file, start_pin

if TYPE_CHECKING:
    from datagen_operator.prompts.pin import DatasetPin

log = logging.getLogger("datagen.worker")


async def check_dataset(config: WorkerConfig) -> DatasetPin | None:
    """The output's pin, the dataset held to it: BadInput when it differs. None: no pin yet, the plan's read
    makes it (shard_files.start_pin)."""
    try:
        return await asyncio.to_thread(start_pin, config)
    except (DatasetError, OSError) as error:
        raise BadInput(f"dataset: {error}", Reason.DATASET_UNUSABLE) from None


@dataclass(frozen=True)
class Servers:
    """What the run's servers told the worker at start."""

    fingerprint: dict[str, Any]
    """Their data-affecting /server_info (every server's the same, or FingerprintMismatch)."""
    limit: ContextLimit
    stream: bool
    """Stream /generate: asked for, and the servers stream incremental output_ids."""


async def meet_servers(
    session: aiohttp.ClientSession, pool: EndpointPool, config: WorkerConfig, stop: asyncio.Event
) -> Servers:
    """Waits for at least one server (ServerUnreachable, or Stopped by a signal); FingerprintMismatch when two
    servers would generate different data."""
    infos = await server_infos(session, pool, config.server_timeout_s, stop)
    prints = {url: server_fingerprint(info) for url, info in infos.items()}
    first_url, first = next(iter(prints.items()))
    for url, other in prints.items():
        if other != first:
            changes = "; ".join(diff_fingerprints(first, other))
            raise FingerprintMismatch(f"servers {first_url} and {url} differ: {changes}")
    limit = context_limit(infos.values())
    log.info(
        "server context: %s tokens (prompt + max_new_tokens), inputs under %s tokens",
        limit.context_length or "unknown",
        limit.max_input or "unknown",
    )
    stream = bool(config.spec.generation.stream)
    if stream and not infos[first_url].get("incremental_streaming_output", False):
        log.warning(
            "generation.stream is on but %s streams cumulative output_ids (O(n^2) bytes); "
            "not streaming. Start SGLang with --incremental-streaming-output to stream.",
            first_url,
        )
        stream = False
    return Servers(first, limit, stream)


def data_fingerprint(config: WorkerConfig, inputs: Inputs, servers: Servers) -> dict[str, Any]:
    """Everything that decides the tokens: the output holds records of one fingerprint only."""
    c = config
    return build_fingerprint(
        tokenizer=tokenizer_fingerprint(c.tokenizer_dir),
        chat_template=inputs.chat_template_sha256,
        server=servers.fingerprint,
        sampling=inputs.sampling,
        preset=c.resolved.preset.name if c.resolved.preset else None,
        thinking=c.resolved.thinking,
        turns=c.spec.generation.turns,
        template_variables=c.resolved.template_variables,
        history_reasoning=c.spec.generation.history_reasoning,
        dataset_sample=c.spec.dataset.sample,
        template_variable_mix=c.spec.generation.template_variable_mix,
    )


def claim_shard(
    layout: OutputLayout, config: WorkerConfig, fingerprint: dict[str, Any], progress: ShardProgress
) -> None:
    """The output is this fingerprint's (FingerprintMismatch otherwise), with the run file beside it; what an
    earlier run of this shard left half-written is gone."""
    removed = remove_stale_temporaries(layout, config.shard_index)
    if removed:
        log.info("removed %d temporary files an earlier run left behind", removed)
    progress.fingerprint_sha256 = fingerprint_sha256(fingerprint)  # shown even when the claim fails
    claim_output(layout, config, fingerprint)
    keep_run_file(config)


async def open_shard(layout: OutputLayout, config: WorkerConfig) -> tuple[ShardWriter, RecoveryReport]:
    """The shard's writer over what earlier runs recorded (a torn tail cut off), holding the reserve."""
    c = config
    writer = ShardWriter(layout, c.shard_index)
    # The compacted Parquet counts as recorded even in a --no-compact run.
    report = await asyncio.to_thread(writer.recover, layout.parquet(c.shard_index, c.shard_count))
    # Room for a true progress.json and manifest entry should the volume fill up (freed then).
    writer.hold_reserve()
    if report.torn_bytes or report.corrupt_lines:
        log.warning(
            "recovered shard %d: dropped a torn tail of %d bytes and %d damaged lines; they will be regenerated",
            c.shard_index,
            report.torn_bytes,
            report.corrupt_lines,
        )
    return writer, report
