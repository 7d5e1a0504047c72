"""What one shard's worker holds: its config, the progress it reports, how it is told to stop, and
the parts each start-up stage sets (inputs, servers, shard files, client, progress sinks).

The worker is one class built in layers, each module adding one concern on the one below:
state -> stopping -> publishing -> feeder -> finishing -> generation -> startup -> main.Worker.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from datagen_operator.api.progress import ShardProgress
from datagen_operator.engine.client.generate import GenerateClient
from datagen_operator.engine.client.pool import EndpointPool
from datagen_operator.output.layout import OutputLayout
from datagen_operator.output.parquet import CompactionResult
from datagen_operator.output.records import ContextLimit
from datagen_operator.output.writer import ShardWriter
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.inputs import Inputs
from datagen_operator.worker.progress import Sinks, Tracker


class WorkerState:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.stop_new = asyncio.Event()  # SIGTERM: no new requests
        self.fatal: tuple[int, str] | None = None
        self.drained = False
        self.abandon = asyncio.Event()  # a second SIGTERM/SIGINT: stop waiting for requests in flight
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=2 * config.spec.clients.concurrency)
        self.volume_error: OSError | None = None
        self.unwritten = 0
        """Answers that reached this worker but not the volume (buffered at the failure, or arriving after)."""
        self.progress = ShardProgress(shard=config.shard_index, shard_count=config.shard_count, started_at=time.time())
        self.layout = OutputLayout(config.output)
        self.samples = config.spec.generation.samples_per_prompt
        # Set as the worker gets that far: inputs, then servers, then the shard's files, then generation.
        self._inputs: Inputs | None = None
        self._pool: EndpointPool | None = None
        self.server_fp: dict[str, Any] | None = None
        self._context_limit: ContextLimit | None = None
        self._writer: ShardWriter | None = None
        self.tracker = Tracker(self.progress)
        self._client: GenerateClient | None = None
        self.remaining: dict[str, int] = {}
        """Samples left per prompt id of the plan read so far."""
        self.planned = False
        """True once the feeder has read the whole plan (the totals are final)."""
        self._sinks: Sinks | None = None
        self.compaction: CompactionResult | None = None
        self.pinned: Any = None
        """np.ndarray: the dataset pin's line hashes (prompts/pin.py), read at start; each prompt is held to it."""
        holder = config.lease_holder
        self.run_id = holder.id if holder is not None else None
        """The run named in each record: the holder of the output's lease (output/lease.py)."""
        self.lease_renewed = 0.0

    @property
    def inputs(self) -> Inputs:
        assert self._inputs is not None, "the inputs load first"
        return self._inputs

    @property
    def pool(self) -> EndpointPool:
        assert self._pool is not None, "the servers are met before generation"
        return self._pool

    @property
    def writer(self) -> ShardWriter:
        assert self._writer is not None, "the shard files are claimed before generation"
        return self._writer

    @property
    def client(self) -> GenerateClient:
        assert self._client is not None, "the client is built with the shard files"
        return self._client

    @property
    def sinks(self) -> Sinks:
        assert self._sinks is not None, "the progress sinks are set up before generation"
        return self._sinks

    @property
    def context_limit(self) -> ContextLimit:
        assert self._context_limit is not None, "the servers are met before generation"
        return self._context_limit
