"""The per-lease gateway forwarder's path rule: its own session's routes, nothing else."""

from __future__ import annotations

import pytest

from services.sandbox_broker.backends.gateway_forwarder import allowed

SID = "0123456789abcdef01234567"


@pytest.mark.parametrize(
    "target",
    [f"/e/{SID}/v1/chat/completions", f"/e/{SID}/v1/messages?beta=true", f"/e/{SID}/v1/models/gpt-4.1",
     f"/e/{SID}/v1beta/models/policy:streamGenerateContent?alt=sse", f"/e/{SID}/v1/responses"],
)  # fmt: skip
def test_the_own_session_passes(target: str) -> None:
    assert allowed(target, SID)


@pytest.mark.parametrize(
    "target",
    [
        "/admin/pools", "/generate", "/metrics", "/v1/chat/completions", f"/e/{SID}", f"/e/{SID}/",
        f"/e/{SID}x/v1/models", f"/e/{SID}/../other/v1/models", f"/e/{SID}/v1/../../../admin/pools",
        f"/e/{SID}/v1/%2e%2e/%2e%2e/admin", f"/e/{SID}/v1//models", f"/e/{SID}/./v1/models",
        f"/e/{SID}/v1beta/models/:x", f"/e/{SID}:/v1/models",
        "/e/fedcba9876543210fedcba98/v1/chat/completions", f"http://127.0.0.1/e/{SID}/v1/models",
    ],
)  # fmt: skip
def test_everything_else_is_refused(target: str) -> None:
    assert not allowed(target, SID)


LEASE = "lease-0123456789abcdef"


@pytest.mark.parametrize(
    "target",
    [f"/leases/{LEASE}/exec", f"/leases/{LEASE}/exec/stream", f"/leases/{LEASE}/files?path=/workspace/a.txt",
     f"/leases/{LEASE}/archive?path=/workspace"],
)  # fmt: skip
def test_a_paired_agents_task_lease_passes(target: str) -> None:
    """A paired agent's sandbox also reaches its task's lease (the broker then checks its lease token)."""
    assert allowed(target, LEASE, "leases") and not allowed(target, SID)


@pytest.mark.parametrize(
    "target",
    ["/leases", f"/leases/{LEASE}", f"/leases/{LEASE}/", f"/leases/{LEASE}x/exec", f"/leases/{LEASE}/../other/exec",
     f"/leases/{LEASE}/%2e%2e/other/exec", "/leases/lease-other/exec", "/templates", f"/e/{SID}/v1/models"],
)  # fmt: skip
def test_no_other_broker_route_passes(target: str) -> None:
    assert not allowed(target, LEASE, "leases")
