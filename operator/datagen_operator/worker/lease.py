"""The output's lease as a worker holds it (output/lease.py): taken before anything is written there, renewed
while the shard generates; another run holding it stops the worker."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from datagen_operator.api.reasons import Reason
from datagen_operator.output.lease import (
    LEASE_RENEW_S,
    STEP_WORKERS,
    WORKER_LEASE_S,
    OutputInUse,
    claim_output,
    take_lease,
)
from datagen_operator.worker.config import BadInput, WorkerConfig

log = logging.getLogger("datagen.worker")


class WorkerLease:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.renewed = 0.0

    def hold(self) -> None:
        """Take the output's lease for the worker's run (or, run by hand without one, respect a run's lease):
        BadInput naming the holder when another run writes this output."""
        try:
            claim_output(self.config.output, self.config.lease_holder, WORKER_LEASE_S, STEP_WORKERS)
        except OutputInUse as busy:
            raise BadInput(str(busy), Reason.OUTPUT_IN_USE) from None
        self.renewed = time.monotonic()

    async def renew(self) -> str | None:
        """Renew the lease every LEASE_RENEW_S; why the worker must stop once another run holds it, else None."""
        holder = self.config.lease_holder
        if holder is None or time.monotonic() - self.renewed < LEASE_RENEW_S:
            return None
        try:
            await asyncio.to_thread(partial(take_lease, self.config.output, holder, WORKER_LEASE_S, step=STEP_WORKERS))
        except OutputInUse as busy:
            return str(busy)
        except OSError as error:
            log.warning("could not renew the output's lease: %s", error)  # the next tick tries again
            return None
        self.renewed = time.monotonic()
        return None
