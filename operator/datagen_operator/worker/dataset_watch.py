"""The dataset watched while the worker generates: a change of any kind (an atomic rename, an in-place write, a
truncation, an append, the file removed) is noticed within about `interval_s`, and the worker stops sending at
once, keeps what it wrote, and fails naming the lines that changed (`DatasetChanged`). Without this a worker
notices only when a line it reads next differs from the pin, or when its shard ends: on GPUs, hours of
generation for a dataset the user no longer has.

One stat per interval: the file's identity (device, inode: a rename) and its size and mtime (a write). Only
when one moved is the file read again, against the output's pin (shard_files.pinned_change, the same rule the
start-up and the finisher use); a touch that left the bytes alone is no change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.reasons import Reason
from datagen_operator.prompts.pin import changed_message, read_pin
from datagen_operator.worker.config import WorkerConfig
from datagen_operator.worker.shard_files import pinned_change
from datagen_operator.worker.stop import Stop

log = logging.getLogger("datagen.worker")

WATCH_INTERVAL_S = 1.0
"""How often the dataset is looked at (one stat); NFS may add its attribute cache's few seconds."""

Identity = tuple[int, int, int, int] | None


def file_identity(path: Path) -> Identity:
    """(device, inode, size, mtime in ns) of `path`, None when it is gone."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class DatasetWatch:
    def __init__(self, config: WorkerConfig, stop: Stop, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.config = config
        self.stop = stop
        self.interval_s = interval_s

    async def loop(self) -> None:
        path = self.config.dataset
        seen = file_identity(path)
        while not self.stop.stop_new.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.stop_new.wait(), self.interval_s)
            now = file_identity(path)
            if now == seen or self.stop.stop_new.is_set():
                continue
            changed = await asyncio.to_thread(self._changed, now)
            if changed is None:  # touched, or pinned only now: the bytes are the pinned ones
                seen = now
                continue
            log.error("%s", changed)
            self.stop.set_fatal(EXIT_BAD_INPUT, changed, Reason.DATASET_CHANGED)
            return

    def _changed(self, now: Identity) -> str | None:
        """The message that refuses the changed file, or None when its bytes are still the pinned ones (or there
        is no pin yet: a JSONL dataset is pinned by the plan's read, which holds every line to it)."""
        path = self.config.dataset
        if now is None:
            return changed_message(path, "the file was removed")
        pinned = read_pin(self.config.output)
        if pinned is None:
            return None
        try:
            return pinned_change(self.config, pinned)
        except FileNotFoundError:
            return changed_message(path, "the file was removed")
