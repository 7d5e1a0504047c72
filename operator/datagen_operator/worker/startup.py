"""Start-up before generation: the inputs, the HTTP session, the signal handlers, the servers and their
fingerprint, the shard's files claimed and recovered, the client built."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from datagen_operator.api.exit_codes import (
    EXIT_DRAINED,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.engine.client.generate import GenerateClient
from datagen_operator.engine.client.policy import (
    RetryPolicy,
    ServerUnreachable,
)
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.engine.client.reads import make_session
from datagen_operator.output.records import context_limit
from datagen_operator.output.writer import ShardWriter
from datagen_operator.prompts.dataset import DatasetError
from datagen_operator.prompts.pin import read_pin
from datagen_operator.worker.config import BadInput, FingerprintMismatch
from datagen_operator.worker.generation import Generation
from datagen_operator.worker.servers import Stopped, server_infos, verifier
from datagen_operator.worker.shard_files import claim_output, dataset_change, hold_output, keep_run_file

log = logging.getLogger("datagen.worker")


class Startup(Generation):
    async def _run(self) -> int:
        from datagen_operator.worker.inputs import load_inputs

        c = self.config
        # The output is this run's before anything is written there (the pin, the claim).
        await asyncio.to_thread(hold_output, c)
        self.lease_renewed = time.monotonic()
        try:
            changed = await asyncio.to_thread(dataset_change, c)
        except (DatasetError, OSError) as error:
            raise BadInput(f"dataset: {error}") from None
        if changed is not None:
            raise BadInput(changed)
        pin = read_pin(c.output)
        self.pinned = pin.line_hashes if pin is not None else None
        self._inputs = inputs = await load_inputs(c)
        session = make_session(c.spec.clients.concurrency, len(c.servers))
        try:
            return await self._with_session(session, inputs.tokenizer)
        finally:
            await session.close()
            inputs.render_pool.close()

    async def _with_session(self, session: Any, tokenizer: Any) -> int:
        from datagen_operator.output.fingerprint import (
            build_fingerprint,
            chat_template_sha256,
            fingerprint_sha256,
            server_fingerprint,
            tokenizer_fingerprint,
        )
        from datagen_operator.output.writer import remove_stale_temporaries

        c = self.config
        pool = EndpointPool(
            c.servers,
            session,
            unreachable_after_s=c.server_timeout_s,
            verify=verifier(session, lambda: self.server_fp),
            stop=None,
        )
        self._pool = pool
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_drain, sig)
        try:
            infos = await server_infos(session, pool, c.server_timeout_s, self.stop_new)
        except ServerUnreachable as error:
            log.error("%s", error)
            return self._fail(EXIT_SERVER_UNREACHABLE, str(error))
        except Stopped:
            return self._fail(EXIT_DRAINED, "stopped before any server answered")
        prints = {url: server_fingerprint(info) for url, info in infos.items()}
        first_url, first = next(iter(prints.items()))
        for url, other in prints.items():
            if other != first:
                from datagen_operator.output.fingerprint import diff_fingerprints

                changes = "; ".join(diff_fingerprints(first, other))
                raise FingerprintMismatch(f"servers {first_url} and {url} differ: {changes}")
        self.server_fp = first
        self._context_limit = context_limit(infos.values())
        log.info(
            "server context: %s tokens (prompt + max_new_tokens), inputs under %s tokens",
            self.context_limit.context_length or "unknown",
            self.context_limit.max_input or "unknown",
        )
        stream = bool(c.spec.generation.stream)
        if stream and not infos[first_url].get("incremental_streaming_output", False):
            log.warning(
                "generation.stream is on but %s streams cumulative output_ids (O(n^2) bytes); "
                "not streaming. Start SGLang with --incremental-streaming-output to stream.",
                first_url,
            )
            stream = False

        fingerprint = build_fingerprint(
            tokenizer=tokenizer_fingerprint(c.tokenizer_dir),
            chat_template=chat_template_sha256(self.inputs.renderer.chat_template),
            server=first,
            sampling=self.inputs.sampling,
            preset=c.resolved.preset.name if c.resolved.preset else None,
            thinking=c.resolved.thinking,
        )
        removed = remove_stale_temporaries(self.layout, c.shard_index)
        if removed:
            log.info("removed %d temporary files an earlier run left behind", removed)
        self.progress.fingerprint_sha256 = fingerprint_sha256(fingerprint)  # shown even when the claim fails
        claim_output(self.layout, c, fingerprint)
        keep_run_file(c)

        writer = ShardWriter(self.layout, c.shard_index)
        # The compacted Parquet counts as recorded even in a --no-compact run.
        report = await asyncio.to_thread(writer.recover, self.layout.parquet(c.shard_index, c.shard_count))
        # Room for a true progress.json and manifest entry should the volume fill up (freed then).
        writer.hold_reserve()
        if report.torn_bytes or report.corrupt_lines:
            log.warning(
                "recovered shard %d: dropped a torn tail of %d bytes and %d damaged lines; they will be regenerated",
                c.shard_index,
                report.torn_bytes,
                report.corrupt_lines,
            )
        self._writer = writer
        self._init_progress(report.records)
        self._client = GenerateClient(
            pool,
            policy=RetryPolicy(c.spec.clients.max_attempts, c.backoff_base_s, c.backoff_cap_s),
            request_timeout_s=c.spec.clients.request_timeout,
            stream=stream,
            on_retry=self.tracker.on_retry,
        )
        try:
            return await self._generate()
        finally:
            writer.release_reserve()
