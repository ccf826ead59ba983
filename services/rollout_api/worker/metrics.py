"""Prometheus metrics of one worker process (its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.protocol.sandboxes import MAX_LEASE_BATCH


class WorkerMetrics:
    def __init__(self, concurrency: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.slots = Gauge("rollout_worker_slots", "episodes this process may run at once", registry=r)
        self.slots.set(concurrency)
        self.running = Gauge("rollout_worker_episodes_running", "episodes running now", registry=r)
        self.taken = Counter("rollout_worker_items_taken_total", "work items taken, by job", ["job"], registry=r)
        self.dead_letters = Counter(
            "rollout_worker_dead_letters_total", "work entries moved to the dead letters, by job and reason",
            ["job", "reason"], registry=r,
        )  # fmt: skip
        self.reclaimed = Counter(
            "rollout_worker_items_reclaimed_total", "items reclaimed from dead workers", ["job"], registry=r
        )
        self.published = Counter(
            "rollout_worker_trajectories_total", "trajectories published, by job and status", ["job", "status"],
            registry=r,
        )  # fmt: skip
        self.infra = Counter("rollout_worker_infra_errors_total", "failed attempts, by stage", ["stage"], registry=r)
        self.turns = Counter("rollout_worker_turns_total", "agent turns of published trajectories", registry=r)
        self.llm_calls = Counter("rollout_worker_llm_calls_total", "LLM calls answered", registry=r)
        self.llm_capacity_waits = Counter(
            "rollout_worker_llm_capacity_waits_total", "LLM calls sent again after the proxy's Retry-After",
            registry=r,
        )  # fmt: skip
        self.episode_seconds = Histogram(
            "rollout_worker_episode_seconds", "episode wall time", registry=r,
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600),
        )  # fmt: skip
        self.outages = Counter(
            "rollout_worker_dependency_outages_total", "outages seen (breaker opened), by service", ["service"],
            registry=r,
        )  # fmt: skip
        self.dependency_up = Gauge(
            "rollout_worker_dependency_up", "1 while the service answers (breaker closed)", ["service"], registry=r
        )
        self.resent = Counter(
            "rollout_worker_calls_resent_total", "calls sent again after an outage, by service", ["service"],
            registry=r,
        )  # fmt: skip
        self.attempts_kept = Counter(
            "rollout_worker_attempts_kept_total", "attempts failed by an outage and run again without spending one",
            registry=r,
        )  # fmt: skip
        self.grade_change_max_bytes = Gauge(
            "rollout_worker_grade_change_max_bytes", "largest agent diff fresh grading takes (a larger one scores 0)",
            registry=r,
        )  # fmt: skip
        self.fresh_grades = Counter(
            "rollout_worker_fresh_grades_total",
            "rewards graded in a fresh sandbox, by outcome: applied, not_taken, not_applied (the last two score 0)",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.grade_dropped_paths = Counter(
            "rollout_worker_grade_dropped_paths_total", "paths of agents' diffs not applied (tests, test infra)",
            registry=r,
        )  # fmt: skip
        self.lease_batches = Counter(
            "rollout_worker_lease_batches_total", "POST /leases/batch requests sent (leases asked for together)",
            registry=r,
        )  # fmt: skip
        self.batched_leases = Counter(
            "rollout_worker_batched_leases_total", "leases asked for in POST /leases/batch requests", registry=r
        )
        self.lease_claims = Counter(
            "rollout_worker_lease_claims_total", "leases asked of the warm pools' offers in Redis, by outcome",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.lease_batch_max = Gauge(
            "rollout_worker_lease_batch_max", "leases one POST /leases/batch carries at most", registry=r
        )
        self.lease_batch_max.set(MAX_LEASE_BATCH)
        self.http_connections = Gauge(
            "rollout_worker_http_connections", "open keep-alive connections (in use + idle; no cap), by service",
            ["service"], registry=r,
        )  # fmt: skip
