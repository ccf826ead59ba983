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
            "Calls whose re-rendered history differed from the recorded ids (the recorded ids were used)",
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
        self.caps = Counter("rollout_gateway_caps", "Calls refused by an episode cap", ["cap"], registry=r)
        self.refused = Counter("rollout_gateway_errors", "Gateway calls answered with an error", ["code"], registry=r)
        self.added = Histogram(
            "rollout_gateway_added_seconds",
            "Gateway time per call beyond the engine call",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )

    def observe(self, route: str, plan: Plan, parsed: ParsedReply, added_s: float) -> None:
        self.calls.labels(route, "merged" if plan.merged else "new_segment").inc()
        if plan.mismatch:
            self.mismatches.inc()
        if parsed.errors:
            self.tool_errors.inc(len(parsed.errors))
        if parsed.calls:
            self.tool_calls.inc(len(parsed.calls))
        self.added.observe(max(0.0, added_s))
