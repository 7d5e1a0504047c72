"""`datagen worker`: generate one shard of a run. What the client Job pods and the local runner execute.

`Worker` builds the shard's parts once, in the order start-up meets what they need, and passes each the
parts it works with: the inputs, the servers' pool and the client, the stop signals, the volume guard, the
ledger over the writer, the publisher, the feeder, the lanes, the finisher. How a run ends is mapped to
the exit code here. Exit codes: api/exit_codes.py (docs/worker.md explains each).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import aiohttp

from datagen_operator.api.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_DRAINED,
    EXIT_FINGERPRINT_MISMATCH,
    EXIT_OUTPUT_VOLUME,
    EXIT_SERVER_UNREACHABLE,
)
from datagen_operator.api.progress import ShardProgress
from datagen_operator.api.reasons import Reason
from datagen_operator.engine.client.generate import GenerateClient
from datagen_operator.engine.client.policy import RetryPolicy, ServerUnreachable
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.engine.client.reads import make_session
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.volume import is_volume_error, volume_reason
from datagen_operator.prompts.pin import today
from datagen_operator.prompts.render import RENDERED_ON
from datagen_operator.worker.config import (
    BadInput,
    FingerprintMismatch,
    WorkerConfig,
    build_parser,
    config_from_args,
    setup_logging,
)
from datagen_operator.worker.failure import FailureReport
from datagen_operator.worker.feeder import Feeder
from datagen_operator.worker.finishing import Finisher
from datagen_operator.worker.generation import Generation
from datagen_operator.worker.inputs import Inputs, load_inputs
from datagen_operator.worker.jobs import JobQueue
from datagen_operator.worker.lanes import Lanes
from datagen_operator.worker.lease import WorkerLease
from datagen_operator.worker.ledger import start_ledger
from datagen_operator.worker.progress import ConfigMapSink, Display, FileSink, Sinks, Tracker, kubernetes_namespace
from datagen_operator.worker.publisher import Publisher
from datagen_operator.worker.servers import ServerCheck, Stopped
from datagen_operator.worker.shard_files import pin_while_read
from datagen_operator.worker.startup import check_dataset, claim_shard, data_fingerprint, meet_servers, open_shard
from datagen_operator.worker.stop import Stop
from datagen_operator.worker.turn_maker import TurnMaker
from datagen_operator.worker.turns import NextTurns
from datagen_operator.worker.volume_guard import VolumeGuard

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

log = logging.getLogger("datagen.worker")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_format)
    try:
        config = config_from_args(args, dict(os.environ))
    except BadInput as error:
        log.error("%s", error)
        return EXIT_BAD_INPUT
    return asyncio.run(Worker(config).run())


class Worker:
    """One shard's worker; `run` maps how it ended to the exit code."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.layout = OutputLayout(config.output)
        # Start-up's progress (its start time, then the fingerprint) until the generation's counters replace it.
        self.tracker = Tracker(
            ShardProgress(shard=config.shard_index, shard_count=config.shard_count, started_at=time.time())
        )
        self.failure = FailureReport(config, self.tracker)

    async def run(self) -> int:
        try:
            return await self._run()
        except BadInput as error:
            log.error("%s", error)
            return self.failure.fail(EXIT_BAD_INPUT, str(error), error.reason)
        except FingerprintMismatch as error:
            log.error("%s", error)
            return self.failure.fail(EXIT_FINGERPRINT_MISMATCH, str(error), Reason.FINGERPRINT_MISMATCH)
        except OSError as error:
            if not is_volume_error(error):
                raise
            # Failed before generation (the manifest, the reserve): nothing was generated. The shard is named as
            # control.progress.failure_of names it, so the condition reads alike whichever of the two is seen first.
            message = f"{self.failure.volume_text(error)} (shard {self.config.shard_index} stopped)"
            reason = volume_reason(error)
            return self.failure.fail(EXIT_OUTPUT_VOLUME, message, reason)

    async def _run(self) -> int:
        c = self.config
        # The output is this run's before anything is written there (the pin, the claim).
        lease = WorkerLease(c)
        await asyncio.to_thread(lease.hold)
        pin = await check_dataset(c)
        inputs = await load_inputs(c)
        if pin is None:  # the plan's read pins the dataset, dated as this worker renders
            pin_while_read(c, inputs.plan, inputs.render_pool.variables.get(RENDERED_ON) or today())
        session = make_session(c.concurrency, len(c.servers))
        try:
            return await self._with_session(session, inputs, lease, pin.line_hashes if pin is not None else None)
        finally:
            await session.close()
            inputs.render_pool.close()

    async def _with_session(
        self, session: aiohttp.ClientSession, inputs: Inputs, lease: WorkerLease, pinned: npt.NDArray[np.uint64] | None
    ) -> int:
        c, tracker = self.config, self.tracker
        check = ServerCheck(session)
        pool = EndpointPool(c.servers, session, unreachable_after_s=c.server_timeout_s, verify=check, stop=None)
        jobs = JobQueue(c.concurrency)
        stop = Stop(pool, jobs, tracker, c.drain_timeout_s)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.request_drain, sig)
        inputs.load_after_first(stop.set_fatal)  # the tokenizer, where the preflight's store lets it wait
        try:
            servers = await meet_servers(session, pool, c, stop.stop_new)
        except ServerUnreachable as error:
            log.error("%s", error)
            return self.failure.fail(EXIT_SERVER_UNREACHABLE, str(error), Reason.SERVER_UNREACHABLE)
        except Stopped:
            return self.failure.fail(EXIT_DRAINED, "stopped before any server answered", Reason.DRAINED)
        check.expected = servers.fingerprint
        claim_shard(self.layout, c, data_fingerprint(c, inputs, servers), tracker.progress)

        writer, report = await open_shard(self.layout, c)
        volume = VolumeGuard(stop, c.output, self.layout.volume_full, c.concurrency)
        ledger = start_ledger(c, writer, volume, tracker, report.records)
        client = GenerateClient(
            pool,
            policy=RetryPolicy(c.spec.clients.max_attempts, c.backoff_base_s, c.backoff_cap_s),
            request_timeout_s=c.spec.clients.request_timeout,
            stream=servers.stream,
            on_retry=tracker.on_retry,
        )
        try:
            sinks = Sinks(
                FileSink(self.layout.progress(c.shard_index)),
                ConfigMapSink(c.progress_configmap, kubernetes_namespace(c.progress_namespace))
                if c.progress_configmap
                else None,
                Display(),
            )
            publisher = Publisher(tracker, pool, sinks, lease, stop, volume, c.progress_interval_s)
            maker = TurnMaker(c, inputs, servers.limit)
            turns = NextTurns(maker, ledger, inputs) if c.spec.generation.turns == "all" else None
            generation = Generation(
                c,
                pool,
                writer,
                ledger,
                stop,
                volume,
                publisher,
                Feeder(c, inputs, ledger, jobs, stop, maker, pinned, turns),
                Lanes(c, inputs, client, jobs, writer, ledger, stop, volume, turns),
                Finisher(c, self.layout, writer, ledger, stop, volume, publisher, self.failure),
            )
            return await generation.run()
        finally:
            writer.release_reserve()
