"""The broker's Prometheus metrics, in a registry of its own (one per app, no globals)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.sandbox_broker.backends.create_phases import PhaseClock
from services.sandbox_broker.backends.launch_ns import BRIEF_LAUNCHES, LaunchNamespace

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lease_start = Histogram("rollout_broker_lease_start_seconds", "request to ready sandbox",
                                     ["backend", "kind"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.lease_wait = Histogram("rollout_broker_lease_wait_seconds", "time queued in admission control",
                                    buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.exec_latency = Histogram("rollout_broker_exec_seconds", "exec through the broker", ["backend"],
                                      buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.command_cpu = Counter("rollout_broker_command_cpu_seconds", "CPU the commands run in sandboxes took "
                                   "(user + system, with the children each waited for), where the backend measures "
                                   "it: the tasks' own work, not the platform's", ["backend"], registry=r)  # fmt: skip
        self.sandbox_create = Histogram("rollout_broker_sandbox_create_seconds", "backend sandbox create", ["backend"],
                                        buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.pool_size = Gauge("rollout_broker_pool_size", "ready sandboxes in a warm pool", ["pool"], registry=r)
        self.pool_target = Gauge("rollout_broker_pool_target", "warm-pool target size", ["pool"], registry=r)
        self.pool_hits = Counter("rollout_broker_pool_hits", "leases served from a warm pool", ["pool"], registry=r)
        self.pool_misses = Counter(
            "rollout_broker_pool_misses", "leases that found the pool empty", ["pool"], registry=r
        )
        self.pool_refills = Counter(
            "rollout_broker_pool_refills", "sandboxes added to a warm pool", ["pool"], registry=r
        )
        self.pool_claims = Counter("rollout_broker_pool_claims", "warm sandboxes workers claimed straight from Redis "
                                   "(no broker request; counted in pool_hits too)", ["pool"], registry=r)  # fmt: skip
        self.template_setups = Counter("rollout_broker_template_setups", "sandboxes of a template with a setup, "
                                       "by how it came: ran (and shared from then on), shared (a copy of "
                                       "that), own (ran, nothing to share)", ["outcome"], registry=r)  # fmt: skip
        self.pool_dead = Counter("rollout_broker_pool_dead", "pooled sandboxes that failed the liveness check",
                                 ["pool"], registry=r)  # fmt: skip
        self.reaped = Counter(
            "rollout_broker_sandboxes_reaped", "sandboxes removed by the reaper", ["reason"], registry=r
        )
        self.warm_misses = Counter("rollout_broker_warm_misses", "leases of a warm-only batch answered warm_miss "
                                   "(not counted in rollout_broker_errors)", registry=r)  # fmt: skip
        self.errors = Counter("rollout_broker_errors", "error responses", ["code"], registry=r)
        self.leases = Gauge("rollout_broker_leases", "current leases (all replicas)", registry=r)
        self.job_leases = Gauge(
            "rollout_broker_job_leases", "current leases per job (all replicas)", ["job"], registry=r
        )
        self.lease_limit = Gauge("rollout_broker_lease_limit", "global lease limit (saturation = leases / limit)",
                                 registry=r)  # fmt: skip
        self.disk_quota = Gauge("rollout_broker_disk_quota_enforced", "1 when the backend enforces disk_mb "
                                "(/healthz isolation.disk_quota says how, or why not)", registry=r)  # fmt: skip
        self.queue = Gauge("rollout_broker_admission_waiting", "lease requests waiting for capacity", registry=r)
        self.lease_cache_hits = Counter("rollout_broker_lease_cache_hits", "lease lookups answered without Redis "
                                        "(lease_cache.py)", registry=r)  # fmt: skip
        self.recovered = Counter(
            "rollout_broker_leases_recovered", "live leases found again after a restart", registry=r
        )


class PhaseCollector(Collector):
    """The local backend's cold-create phases (``create_phases.py``), read at scrape time."""

    def __init__(self, clock: PhaseClock) -> None:
        self.clock = clock

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = {
            "wall_s": CounterMetricFamily("rollout_broker_create_phase_seconds", "wall seconds of sandbox "
                                          "creates per phase", labels=["phase"]),
            "cpu_s": CounterMetricFamily("rollout_broker_create_phase_cpu_seconds", "the broker's CPU seconds "
                                         "per create phase (in the phase's thread)", labels=["phase"]),
            "children_cpu_s": CounterMetricFamily("rollout_broker_create_phase_children_cpu_seconds", "CPU of "
                                                  "children reaped during a create phase (overlapping creates "
                                                  "share it)", labels=["phase"]),
            "count": CounterMetricFamily("rollout_broker_create_phases", "create phases run", labels=["phase"]),
        }  # fmt: skip
        for phase, figures in self.clock.snapshot().items():
            for key, family in families.items():
                family.add_metric([phase], figures[key])
        yield from families.values()


class LaunchCollector(Collector):
    """The local backend's launch namespace (``launch_ns.py``) and its limit, read at scrape time."""

    def __init__(self, space: LaunchNamespace) -> None:
        self.space = space

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("rollout_broker_launch_namespace", "1 while sandboxes start from the launch "
                                "namespace (/healthz isolation.launch_namespace says why not)",
                                value=0 if self.space.path is None else 1)  # fmt: skip
        yield GaugeMetricFamily("rollout_broker_agent_start_limit", "agent starts at once (each holds its "
                                "sandbox in the launch namespace until it is up)", value=BRIEF_LAUNCHES)  # fmt: skip
        yield GaugeMetricFamily("rollout_broker_agent_starts", "agent starts now (saturation = starts / limit)",
                                value=self.space.starting)  # fmt: skip
        yield GaugeMetricFamily("rollout_broker_launch_namespace_sandboxes", "sandboxes attached to the "
                                "launch namespace now", value=len(self.space.users))  # fmt: skip
