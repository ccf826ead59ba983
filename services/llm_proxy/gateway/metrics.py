"""The gateway's Prometheus series, in the proxy's registry (summed across processes)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.llm_proxy.gateway.parsers import ParsedReply
from services.llm_proxy.gateway.tokens import Plan
from services.llm_proxy.metrics import OVERHEAD_BUCKETS


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter("rollout_gateway_calls", "Gateway calls recorded", ["route", "kind"], registry=r)
        self.mismatches = Counter(
            "rollout_gateway_retokenization_mismatches",
            "Calls whose re-rendered history differed from the recorded ids (the recorded ids were used), "
            "per route (dialect); per harness: rollout bench agents and AgentRun.retokenization_mismatches",
            ["route"],
            registry=r,
        )
        self.tool_errors = Counter(
            "rollout_gateway_tool_parse_errors", "Tool-call markup that did not parse", registry=r
        )
        self.tool_calls = Counter("rollout_gateway_tool_calls", "Tool calls parsed from generations", registry=r)
        self.replanned = Counter(
            "rollout_gateway_replanned",
            "Calls planned early from this process's copy of the session's last call that Redis did not "
            "confirm (planned again; the early engine call was aborted)",
            registry=r,
        )
        self.fidelity = Counter(
            "rollout_gateway_tool_fidelity",
            "Tool calls per pool by what the pool's parser made of them: parsed (a known tool), "
            "unknown_tool (parsed, but not one of the request's tools), malformed (markup that did not parse)",
            ["pool", "outcome"],
            registry=r,
        )
        self.caps = Counter("rollout_gateway_caps", "Calls refused by an episode cap", ["cap"], registry=r)
        self.refused = Counter("rollout_gateway_errors", "Gateway calls answered with an error", ["code"], registry=r)
        self.added = Histogram(
            "rollout_gateway_added_seconds",
            "Gateway time per call beyond the engine call",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )

    def observe(
        self,
        route: str,
        plan: Plan,
        parsed: ParsedReply,
        added_s: float,
        pool: str = "",
        tools: frozenset[str] = frozenset(),
    ) -> None:
        """One recorded call; ``tools``: the names of the tools the request offered."""
        self.calls.labels(route, "merged" if plan.merged else "new_segment").inc()
        unknown = sum(1 for name, _ in parsed.calls if name not in tools)
        if parsed.calls or parsed.errors:
            self.fidelity.labels(pool, "parsed").inc(len(parsed.calls) - unknown)
            self.fidelity.labels(pool, "unknown_tool").inc(unknown)
            self.fidelity.labels(pool, "malformed").inc(len(parsed.errors))
        if plan.mismatch:
            self.mismatches.labels(route).inc()
        if parsed.errors:
            self.tool_errors.inc(len(parsed.errors))
        if parsed.calls:
            self.tool_calls.inc(len(parsed.calls))
        self.added.observe(max(0.0, added_s))
