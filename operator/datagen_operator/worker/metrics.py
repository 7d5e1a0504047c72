"""Prometheus metrics of one shard, read from the progress snapshot at scrape time (no hot-path cost)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from datagen_operator.api.progress import ShardProgress

PREFIX = "datagen_worker"


class ProgressCollector(Collector):
    def __init__(self, snapshot: Callable[[], ShardProgress]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        p = self.snapshot()
        labels = ["shard"]
        shard = [str(p.shard)]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            family.add_metric(shard, value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)
            family.add_metric(shard, value)
            return family

        yield counter("records", "Records written (resumed ones included).", p.records_done)
        c = p.counts
        yield counter("records_rejected", "Records refused by the server (4xx).", c.refused)
        yield counter(
            "records_set_aside",
            "Records never made, not for the server's sake: samples of prompts set aside, turns cut short.",
            c.records_set_aside,
        )
        yield counter("records_failed", "Records that ran out of attempts in this run.", c.failed)
        yield counter("prompt_tokens", "Prompt tokens of written records.", c.prompt_tokens)
        yield counter("output_tokens", "Output tokens of written records.", c.output_tokens)
        yield counter("malformed_lines", "Dataset lines set aside as malformed.", p.malformed_lines)
        set_aside = CounterMetricFamily(
            f"{PREFIX}_prompts_set_aside", "Prompts set aside unsent, by cause.", labels=["shard", "cause"]
        )
        for cause, count in sorted(c.set_aside.items()):
            set_aside.add_metric([str(p.shard), cause], count)
        yield set_aside
        errors = CounterMetricFamily(f"{PREFIX}_errors", "Retried request failures by kind.", labels=["shard", "kind"])
        for kind, count in sorted(p.errors.items()):
            errors.add_metric([str(p.shard), kind], count)
        yield errors
        flags = CounterMetricFamily(
            f"{PREFIX}_flags", "Records raising each inline check flag.", labels=["shard", "flag"]
        )
        for flag, count in sorted(c.flags.items()):
            flags.add_metric([str(p.shard), flag], count)
        yield flags
        yield gauge("in_flight", "Requests in flight.", p.in_flight)
        yield gauge("tokens_per_second", "Output tokens per second over the last 30 s.", p.tokens_per_s)
        yield gauge("records_expected", "Records this shard must produce.", p.records_total)
        yield gauge("prompts_expected", "Valid prompts of this shard.", p.prompts_total)
        yield gauge("prompts_done", "Prompts with nothing left to do.", p.prompts_done)
        yield gauge("servers_up", "Server endpoints in rotation.", p.servers_up)
        state = GaugeMetricFamily(f"{PREFIX}_state", "1 for the shard's current state.", labels=["shard", "state"])
        state.add_metric([str(p.shard), p.state], 1)
        yield state


def serve_metrics(port: int, snapshot: Callable[[], ShardProgress], addr: str = "0.0.0.0") -> CollectorRegistry:
    """Expose /metrics on `port` (a daemon thread); returns the registry (for tests)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProgressCollector(snapshot))
    start_http_server(port, addr=addr, registry=registry)
    return registry
