"""`/metrics` with SGLang's `sglang:*` names (SGLang 0.5.23 sglang/srt/observability/metrics_collector.py),
labelled with model_name."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from datagen_operator.engine.sim.occupancy import Occupancy

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
_THROUGHPUT_WINDOW_S = 10.0

__all__ = ["CONTENT_TYPE", "SimMetrics"]


class SimMetrics:
    content_type = CONTENT_TYPE

    def __init__(self, model_name: str, max_total_tokens: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.").labels(model_name)
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.").labels(model_name)
        self.throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).").labels(model_name)
        self.token_usage = gauge("sglang:token_usage", "The token usage.").labels(model_name)
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.").labels(model_name)
        # prometheus_client appends `_total` to counter names itself.
        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.").labels(model_name)
        self.generation_tokens = counter("sglang:generation_tokens", "Number of generation tokens processed.").labels(
            model_name
        )
        self.requests = counter("sglang:num_requests", "Number of requests processed.").labels(model_name)
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token.").labels(
            model_name
        )
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "Histogram of end-to-end latency.").labels(
            model_name
        )
        self._max_total_tokens = max_total_tokens
        self._running_tokens = 0
        self._prompt_total = 0
        self._cached_total = 0
        self._recent: deque[tuple[float, int]] = deque()
        self.occupancy: Occupancy | None = None
        """Set with --sim-expected-in-flight: its figures are rendered as the sglang_sim:* gauges."""
        self._occupancy_gauges = {
            name: gauge(f"sglang_sim:{name}", doc).labels(model_name)
            for name, doc in (
                ("bulk_seconds", "Seconds from bulk start (the expected requests first in flight) to the last answer."),
                ("underfilled_seconds", "Seconds of bulk_seconds with fewer requests in flight than expected."),
                ("sending_seconds", "Seconds from bulk start to the last request received."),
                ("sending_underfilled_seconds", "Seconds of sending_seconds with fewer in flight than expected."),
                ("idle_slot_seconds", "Requests missing from the expected in flight, times seconds, in bulk_seconds."),
                ("sending_idle_slot_seconds", "Requests missing from the expected in flight x seconds, sending."),
                ("expected_in_flight", "The requests the clients should keep in flight (--sim-expected-in-flight)."),
            )
        }

    def started(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.running.inc()
        self._running_tokens += prompt_tokens
        self._prompt_total += prompt_tokens
        self._cached_total += cached_tokens
        self.prompt_tokens.inc(prompt_tokens)

    def stopped(self, prompt_tokens: int) -> None:
        """A request left the running batch (finished or aborted)."""
        self.running.dec()
        self._running_tokens -= prompt_tokens

    def finished(self, prompt_tokens: int, completion_tokens: int, ttft_s: float, e2e_s: float) -> None:
        self.generation_tokens.inc(completion_tokens)
        self.requests.inc()
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        self._recent.append((time.monotonic(), completion_tokens))

    def render(self) -> bytes:
        now = time.monotonic()
        while self._recent and self._recent[0][0] < now - _THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        self.throughput.set(sum(tokens for _, tokens in self._recent) / _THROUGHPUT_WINDOW_S)
        self.token_usage.set(min(1.0, self._running_tokens / self._max_total_tokens))
        self.cache_hit_rate.set(self._cached_total / self._prompt_total if self._prompt_total else 0.0)
        if self.occupancy is not None:
            o, gauges = self.occupancy, self._occupancy_gauges
            gauges["bulk_seconds"].set(o.bulk_seconds())
            gauges["underfilled_seconds"].set(o.underfilled_seconds())
            gauges["sending_seconds"].set(o.sending_seconds())
            gauges["sending_underfilled_seconds"].set(o.sending_underfilled_seconds())
            gauges["idle_slot_seconds"].set(o.idle_slot_seconds())
            gauges["sending_idle_slot_seconds"].set(o.sending_idle_slot_seconds())
            gauges["expected_in_flight"].set(o.expected)
        return generate_latest(self.registry)
