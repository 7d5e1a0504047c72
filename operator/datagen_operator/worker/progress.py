"""Progress of one shard: counters, and where they go (progress.json, a ConfigMap, a bar or log lines).

The snapshot is one JSON object (ShardProgress). It is written to `shards/<i>/progress.json` every
couple of seconds, and, in a cluster, patched into the shard's own ConfigMap (`<run>-shard-<i>`,
pre-created by the operator; the worker's Role may only get/patch those names) at most every 5 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from datagen_operator.api.progress import ShardProgress

if TYPE_CHECKING:  # imported where used: a worker without a terminal or a ConfigMap never loads them
    from kubernetes_asyncio.client import ApiClient, CoreV1Api
    from rich.console import Console
    from rich.progress import Progress, TaskID

log = logging.getLogger("datagen.worker.progress")


class Tracker:
    """Counters updated on the hot path with plain integer adds; snapshots are built on the slow path."""

    def __init__(self, progress: ShardProgress, window_s: float = 30.0) -> None:
        self._window_s = window_s
        self.restart(progress)

    def restart(self, progress: ShardProgress) -> None:
        """Count into `progress` from now on, from zero (the generation's counters replace start-up's)."""
        self.progress = progress
        self.errors: Counter[str] = Counter()
        self._samples: deque[tuple[float, int]] = deque()

    def on_retry(self, kind: str) -> None:
        self.errors[kind] += 1

    def snapshot(self, now: float | None = None) -> ShardProgress:
        now = time.time() if now is None else now
        p = self.progress
        samples = self._samples
        samples.append((now, p.counts.output_tokens))
        while len(samples) > 2 and samples[1][0] <= now - self._window_s:
            samples.popleft()
        first_t, first_tokens = samples[0]
        p.tokens_per_s = round((p.counts.output_tokens - first_tokens) / (now - first_t), 1) if now > first_t else 0.0
        p.errors = dict(self.errors)
        p.updated_at = now
        return p


# --- sinks -----------------------------------------------------------------------------------------


class FileSink:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, snapshot: ShardProgress) -> None:
        from datagen_operator.output.layout import write_atomic

        # Not fsynced: progress is informational and rebuilt exactly from the records on restart.
        write_atomic(self.path, snapshot.for_storage(indent=True), durable=False)


def kubernetes_namespace(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    return "default"


class ConfigMapSink:
    """Patches `data["progress.json"]` of a ConfigMap the operator created; needs only get/patch on it.

    Best effort: a failing patch is logged (once per kind of error) and never stops generation.
    """

    def __init__(self, name: str, namespace: str, min_interval_s: float = 5.0) -> None:
        self.name = name
        self.namespace = namespace
        self.min_interval_s = min_interval_s
        self._api: CoreV1Api | None = None
        self._client: ApiClient | None = None
        self._last = float("-inf")
        self._logged: set[str] = set()

    async def _connect(self) -> CoreV1Api:
        from kubernetes_asyncio import client, config

        kubeconfig = os.environ.get("KUBECONFIG")
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
            config.load_incluster_config()  # type: ignore[no-untyped-call]  # unannotated in kubernetes_asyncio
        else:
            # Explicit: the library reads $KUBECONFIG once, at import time.
            await config.load_kube_config(config_file=kubeconfig.split(os.pathsep)[0] if kubeconfig else None)
        self._client = client.ApiClient()
        self._api = client.CoreV1Api(self._client)
        return self._api

    async def write(self, snapshot: ShardProgress, *, force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return False
        self._last = now
        body = {"data": {"progress.json": snapshot.for_storage().decode()}}
        try:
            api = self._api or await self._connect()
            await api.patch_namespaced_config_map(self.name, self.namespace, body)
            return True
        except Exception as error:
            kind = type(error).__name__ + str(getattr(error, "status", ""))
            if kind not in self._logged:
                self._logged.add(kind)
                log.warning("cannot patch ConfigMap %s/%s with progress: %s", self.namespace, self.name, error)
            return False

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()


_console: Console | None = None


def terminal_console() -> Console:
    """One rich Console on stderr shared by the progress bar and the log handler, so log lines print
    above the bar instead of through it."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True)
    return _console


class Display:
    """A rich progress bar on a terminal; otherwise one structured log line every `log_interval_s`."""

    def __init__(self, *, tty: bool | None = None, log_interval_s: float = 10.0) -> None:
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.log_interval_s = log_interval_s
        self._last_log = float("-inf")  # the first update always logs
        self._bar: tuple[Progress, TaskID] | None = None
        """The bar and its one task, once the first snapshot is shown."""

    def update(self, snapshot: ShardProgress) -> None:
        if self.tty:
            self._update_bar(snapshot)
            return
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            log.info("%s", snapshot.summary_line(), extra={"fields": _log_fields(snapshot)})

    def _update_bar(self, snapshot: ShardProgress) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        if self._bar is None:
            bar = Progress(
                TextColumn(f"shard {snapshot.shard}/{snapshot.shard_count}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                console=terminal_console(),
                transient=False,
            )
            bar.start()
            self._bar = bar, bar.add_task("records", total=snapshot.records_total, info="")
        bar, task = self._bar
        counts = snapshot.counts
        info = (
            f"{snapshot.state} {snapshot.tokens_per_s / 1000:.1f}k tok/s in-flight {snapshot.in_flight} "
            f"refused {counts.refused} set aside {sum(counts.set_aside.values())} retries {sum(snapshot.errors.values())}"
        )
        done = counts.records + counts.refused + counts.records_set_aside
        bar.update(task, completed=done, total=snapshot.records_total, info=info)

    def close(self, snapshot: ShardProgress) -> None:
        if self._bar is not None:
            self._update_bar(snapshot)
            self._bar[0].stop()
            self._bar = None
        log.info("%s", snapshot.message or snapshot.summary_line(), extra={"fields": _log_fields(snapshot)})


def _log_fields(snapshot: ShardProgress) -> dict[str, Any]:
    fields = orjson.loads(snapshot.for_storage())
    return {k: v for k, v in fields.items() if k not in ("started_at", "updated_at")}


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line (for log collectors): time, level, logger, message, plus `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            body.update(fields)
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


@dataclass
class Sinks:
    """Where a running worker's snapshots go."""

    file: FileSink
    configmap: ConfigMapSink | None
    display: Display
