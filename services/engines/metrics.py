"""``/metrics`` with SGLang's ``sglang:`` names, one registry per engine (several share a process)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300, 600, 1200)


@dataclass(frozen=True, slots=True)
class BatchSnapshot:
    running: int
    waiting: int
    used_tokens: int
    capacity_tokens: int
    cache_hit_rate: float
    retractions: int
    generated_tokens_total: int


class EngineMetrics:
    """Gauges are set from a snapshot at scrape time; counters follow finished requests."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("sglang:num_running_reqs", "Running requests", labels, registry=r)
        self.queued = Gauge("sglang:num_queue_reqs", "Waiting requests", labels, registry=r)
        self.used = Gauge("sglang:num_used_tokens", "KV tokens in use", labels, registry=r)
        self.usage = Gauge("sglang:token_usage", "KV usage fraction", labels, registry=r)
        self.hit_rate = Gauge("sglang:cache_hit_rate", "Prefix cache hit rate", labels, registry=r)
        self.retracted = Gauge("sglang:num_retracted_reqs", "Retractions so far", labels, registry=r)
        self.throughput = Gauge("sglang:gen_throughput", "Generated tokens per second", labels, registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens", labels, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generated tokens", labels, registry=r)
        self.requests = Counter("sglang:num_requests", "Finished requests", labels, registry=r)
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end latency", labels, buckets=LATENCY_BUCKETS, registry=r
        )
        self._last: tuple[int, float] | None = None

    def observe_finished(self, prompt_tokens: int, completion_tokens: int, latency_s: float) -> None:
        name = self.model_name
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.generation_tokens.labels(name).inc(completion_tokens)
        self.requests.labels(name).inc()
        self.e2e.labels(name).observe(latency_s)

    def render(self, snap: BatchSnapshot, now: float) -> bytes:
        name = self.model_name
        self.running.labels(name).set(snap.running)
        self.queued.labels(name).set(snap.waiting)
        self.used.labels(name).set(snap.used_tokens)
        self.usage.labels(name).set(snap.used_tokens / snap.capacity_tokens)
        self.hit_rate.labels(name).set(snap.cache_hit_rate)
        self.retracted.labels(name).set(snap.retractions)
        if self._last is not None and now > self._last[1]:
            self.throughput.labels(name).set((snap.generated_tokens_total - self._last[0]) / (now - self._last[1]))
        self._last = (snap.generated_tokens_total, now)
        return generate_latest(self.registry)
